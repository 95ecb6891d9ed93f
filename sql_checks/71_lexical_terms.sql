-- BM25 document frequencies per scope set and lexeme (0041): appended by the chunk triggers
-- (only when a chunk's terms or scopes change), read under the chunks' rule (allow and
-- deny), never writable by the app, compacted and purged with the tenant.
begin;
select plan(14);

select tests.make_tenant('t-lt-a', array['team', 'exec']);
select tests.make_tenant('t-lt-b', array['team']);
select tests.make_document('t-lt-a', 'team.md', array['team'], 'river river bridge');
select tests.make_document('t-lt-a', 'team2.md', array['team'], 'river harbour');
select tests.make_document('t-lt-a', 'exec.md', array['exec'], 'river secret');
select tests.make_document('t-lt-b', 'b.md', array['team'], 'river delta');

select ok((select relrowsecurity and relforcerowsecurity from pg_class
            where oid = 'recall.lexical_terms'::regclass), 'lexical_terms has forced RLS');

select tests.act_as('t-lt-a', 'alice', array['team'], '{}');
select is((select sum(chunks)::int from recall.lexical_terms where lexeme = 'river'), 2,
          'select allow: a team reader''s df of river counts the two team chunks');
select is((select sum(chunks)::int from recall.lexical_terms where lexeme = 'bridg'), 1,
          'a chunk counts once however often it repeats the term');
select is_empty($$select 1 from recall.lexical_terms where lexeme = 'secret'$$,
                'select deny: a term only an unreadable scope holds is invisible');
select is_empty($$select 1 from recall.lexical_terms where tenant_id = tests.tenant('t-lt-b')$$,
                'select deny: another tenant''s terms are invisible');
select throws_ok($$insert into recall.lexical_terms (tenant_id, scopes, lexeme, chunks)
                   values (tests.tenant('t-lt-a'), array[tests.scope('t-lt-a', 'team')], 'river', 100)$$,
                 '42501', null, 'insert deny: the app cannot forge a df');
reset role;

select tests.act_as('t-lt-a', 'alice', array['team', 'exec'], array['team', 'exec']);
select is((select sum(chunks)::int from recall.lexical_terms where lexeme = 'river'), 3,
          'a reader of both scopes sums the df over both scope sets');
select lives_ok($$update sources.chunks set embedding = null
                   where document_id = (select id from sources.documents where path = 'team.md')$$,
                'a write that changes no term (an embedding) ...');
select is((select count(*)::int from recall.lexical_terms where lexeme = 'river'), 3,
          '... appends no delta');
select lives_ok($$update sources.chunks set text = 'harbour only'
                   where document_id = (select id from sources.documents where path = 'team2.md')$$,
                'a chunk''s text changes');
select is((select sum(chunks)::int from recall.lexical_terms where lexeme = 'river'), 2,
          'the term it lost is one chunk rarer');
reset role;

select is(recall.compact_lexical_stats(tests.tenant('t-lt-a')) >= 1, true, 'compaction runs');
select is((select count(*)::int from recall.lexical_terms
            where tenant_id = tests.tenant('t-lt-a') and lexeme = 'river'), 2,
          'compacted: one row per scope set and lexeme (team and exec)');

delete from auth.tenants where org_id = 't-lt-b';
set constraints all immediate;
select is((select count(*)::int from recall.lexical_terms s
            where not exists (select 1 from auth.tenants t where t.id = s.tenant_id)), 0,
          'a deleted tenant''s terms are purged with it');

select * from finish();
rollback;
