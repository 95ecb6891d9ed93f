-- BM25 document frequencies per scope set and lexeme (0041): deltas appended by the chunk
-- triggers (one row per statement and scope set; none when a chunk's terms and scopes stay),
-- folded by fold_lexical_terms, both read under the chunks' rule (allow and deny), never
-- writable by the app, purged with the tenant.
begin;
select plan(21);

select tests.make_tenant('t-lt-a', array['team', 'exec']);
select tests.make_tenant('t-lt-b', array['team']);
select tests.make_document('t-lt-a', 'team.md', array['team'], 'river river bridge');
select tests.make_document('t-lt-a', 'team2.md', array['team'], 'river harbour');
select tests.make_document('t-lt-a', 'exec.md', array['exec'], 'river secret');
select tests.make_document('t-lt-b', 'b.md', array['team'], 'river delta');

-- What a reader's df is: the folded counts plus the deltas not folded yet.
create temp view df with (security_invoker = true) as
    select x.lexeme, sum(x.n)::int as df from (
        select t.lexeme, t.chunks as n from recall.lexical_terms t
        union all
        select u.lexeme, d.sign from recall.lexical_term_deltas d
         cross join unnest(d.lexemes) as u(lexeme)) x
     group by x.lexeme;
grant select on df to engram_app;

select ok((select bool_and(relrowsecurity and relforcerowsecurity) from pg_class
            where oid in ('recall.lexical_terms'::regclass, 'recall.lexical_term_deltas'::regclass)),
          'both df tables have forced RLS');
select is((select count(*)::int from recall.lexical_term_deltas where tenant_id = tests.tenant('t-lt-a')), 3,
          'one delta row per chunk-writing statement and scope set');

select tests.act_as('t-lt-a', 'alice', array['team'], '{}');
select is((select df from df where lexeme = 'river'), 2,
          'select allow: a team reader''s df of river counts the two team chunks');
select is((select df from df where lexeme = 'bridg'), 1,
          'a chunk counts once however often it repeats the term');
select is_empty($$select 1 from df where lexeme = 'secret'$$,
                'select deny: a term only an unreadable scope holds is invisible');
select is_empty($$select 1 from recall.lexical_term_deltas where tenant_id = tests.tenant('t-lt-b')$$,
                'select deny: another tenant''s deltas are invisible');
select throws_ok($$insert into recall.lexical_terms (tenant_id, lexeme, scopes, chunks)
                   values (tests.tenant('t-lt-a'), 'river', array[tests.scope('t-lt-a', 'team')], 100)$$,
                 '42501', null, 'insert deny: the app cannot forge a df');
select throws_ok($$select recall.fold_lexical_terms(1)$$, '42501', null,
                 'fold deny: the app does not fold');
reset role;

select tests.act_as('t-lt-a', 'alice', array['team', 'exec'], array['team', 'exec']);
select is((select df from df where lexeme = 'river'), 3,
          'a reader of both scopes sums the df over both scope sets');
select lives_ok($$update sources.chunks set embedding = null
                   where document_id = (select id from sources.documents where path = 'team.md')$$,
                'a write that changes no term (an embedding) ...');
select is((select count(*)::int from recall.lexical_term_deltas), 3, '... appends no delta');
select lives_ok($$update sources.chunks set text = 'harbour only'
                   where document_id = (select id from sources.documents where path = 'team2.md')$$,
                'a chunk''s text changes');
select is((select df from df where lexeme = 'river'), 2, 'the term it lost is one chunk rarer');
reset role;

select set_config('tests.lt_a', tests.tenant('t-lt-a')::text, true);
set local role engram_worker;
select is(recall.fold_lexical_terms(1, current_setting('tests.lt_a')::uuid), 1,
          'fold allow: the worker folds a tenant''s deltas');
reset role;
select is((select count(*)::int from recall.lexical_term_deltas where tenant_id = tests.tenant('t-lt-a')), 0,
          'no delta of it is left after the fold');
select is((select array_agg(chunks order by chunks) from recall.lexical_terms
            where tenant_id = tests.tenant('t-lt-a') and lexeme = 'river'), array[1, 1]::bigint[],
          'folded: one row per scope set and lexeme (team and exec), the sums of the deltas');

-- A folded count that reaches 0 goes (0090: 0041's fold left such rows at 0 for good).
select tests.act_as('t-lt-a', 'alice', array['team', 'exec'], array['team', 'exec']);
select lives_ok($$update sources.chunks set text = 'bridge only'
                   where document_id = (select id from sources.documents where path = 'team.md')$$,
                'the last team chunk holding river loses it');
reset role;
set local role engram_worker;
select is(recall.fold_lexical_terms(1, current_setting('tests.lt_a')::uuid), 1,
          'the worker folds that delta');
reset role;
select is((select array_agg(chunks) from recall.lexical_terms
            where tenant_id = tests.tenant('t-lt-a') and lexeme = 'river'), array[1]::bigint[],
          'river''s team row is gone, its exec row stays');
select is((select count(*)::int from recall.lexical_terms
            where tenant_id = tests.tenant('t-lt-a') and chunks = 0), 0,
          'no folded row is left at 0');

delete from auth.tenants where org_id = 't-lt-b';
set constraints all immediate;
select is((select count(*)::int from recall.lexical_terms s
            where not exists (select 1 from auth.tenants t where t.id = s.tenant_id)), 0,
          'a deleted tenant''s terms are purged with it');

select * from finish();
rollback;
