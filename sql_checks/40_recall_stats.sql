-- Recall's BM25 statistics and title key: deltas appended by trigger, read under
-- the chunks' rule (allow and deny), never writable by the app, purged with the tenant.
begin;
select plan(12);

select tests.make_tenant('t-rec-a', array['team', 'exec']);
select tests.make_tenant('t-rec-b', array['team']);
select tests.make_document('t-rec-a', 'team.md', array['team'], 'alpha beta beta');
select tests.make_document('t-rec-a', 'exec.md', array['exec'], 'gamma');
select tests.make_document('t-rec-b', 'b.md', array['team'], 'delta');

select tests.act_as('t-rec-a', 'alice', array['team'], '{}');
select is((select sum(chunks)::int from recall.lexical_stats), 1,
          'select allow: a team reader counts the team chunk only');
select is((select sum(tokens)::int from recall.lexical_stats), 3,
          'the total length is the sum of the visible chunks'' token counts');
select is_empty($$select 1 from recall.lexical_stats where scopes = array[tests.scope('t-rec-a', 'exec')]$$,
                'select deny: statistics of an unreadable scope are invisible');
select is_empty($$select 1 from recall.lexical_stats where tenant_id = tests.tenant('t-rec-b')$$,
                'select deny: another tenant''s statistics are invisible');
select throws_ok($$insert into recall.lexical_stats (tenant_id, scopes, chunks, tokens)
                   values (tests.tenant('t-rec-a'), array[tests.scope('t-rec-a', 'team')], 100, 100)$$,
                 '42501', null, 'insert deny: the app cannot forge statistics');
reset role;

select tests.act_as('t-rec-a', 'alice', array['team', 'exec'], array['team']);
select lives_ok($$delete from sources.documents where path = 'team.md'$$,
                'a writer deletes a document (its chunks cascade)');
select is((select coalesce(sum(chunks), 0)::int from recall.lexical_stats
            where scopes = array[tests.scope('t-rec-a', 'team')]), 0,
          'the cascade appended a negative delta: the team corpus is empty again');
select is((select count(*)::int from recall.lexical_stats), 3,
          'deltas are appended, never updated in place');
reset role;

select tests.act_as_nobody();
select is_empty('select 1 from recall.lexical_stats', 'no identity bound: sees nothing');
reset role;

select is(recall.title_key('  Kyōto — Trip: JLPT N2! '), 'kyoto trip jlpt n2',
          'title keys are lowercase, unaccented words joined by single spaces');

delete from auth.tenants where org_id = 't-rec-b';
-- The purge is deferred to commit; this transaction rolls back, so fire it now.
set constraints all immediate;
select is((select count(*)::int from recall.lexical_stats where tenant_id = tests.tenant('t-rec-a')), 3,
          'deleting another tenant leaves these statistics');
select is((select count(*)::int from recall.lexical_stats s
            where not exists (select 1 from auth.tenants t where t.id = s.tenant_id)), 0,
          'a deleted tenant''s statistics are purged with it');

select * from finish();
rollback;
