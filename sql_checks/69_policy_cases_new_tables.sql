-- Policy cases for the tables of 0040 (provenance.receipt_queue), 0041 (recall.lexical_terms,
-- recall.lexical_term_deltas) and 0050 (memory.rank_models, memory.rank_events): an allow and a
-- deny for each policy those tables have beyond the role-wide reads that 68 loops over (their
-- verifier and auditor policies), tagged [policy <name> allow|deny] for 65_policy_coverage.sql.
--
-- The owner's "for all using (true)" policies are exercised where Engram uses them (the
-- SECURITY DEFINER triggers and functions that run as engram_owner) and directly as the owner.
-- Their deny cases give engram_app, which the policies do not name, the table privileges it
-- lacks (inside this transaction, rolled back at the end), so what refuses it is row level
-- security and nothing else: it sees none of the rows, changes none, and an insert is refused
-- with the policy's 42501. The same grant of the column user_id shows rank_events' WITH CHECK
-- refusing a row recorded for another user.
begin;
select plan(44);

select tests.make_tenant('t-pn-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-pn-b', array['team']) is not null as made;
select set_config('tests.tenant_a', tests.tenant('t-pn-a')::text, true) is not null as a,
       set_config('tests.tenant_b', tests.tenant('t-pn-b')::text, true) is not null as b;
-- The two tenants' ids for roles that cannot read auth.tenants.
create function pg_temp.a() returns uuid language sql as $$ select current_setting('tests.tenant_a')::uuid $$;
create function pg_temp.b() returns uuid language sql as $$ select current_setting('tests.tenant_b')::uuid $$;
create temp table fx (name text primary key, id uuid);
grant select, insert on fx to public;

-- The integer a query (a count) returns as p_role; -1 when p_role has no privilege for it.
create function pg_temp.count_as(p_role text, p_sql text) returns integer language plpgsql as $$
declare
    n integer;
begin
    perform set_config('role', p_role, true);
    execute p_sql into n;
    perform set_config('role', 'none', true);
    return n;
exception when insufficient_privilege then
    return -1;  -- the subtransaction's rollback has undone the role change
end $$;

-- Rows a statement touched as the current role, undone at once.
create function pg_temp.touched(p_sql text) returns integer language plpgsql as $$
declare
    n integer;
begin
    begin
        execute p_sql;
        get diagnostics n = row_count;
        raise exception using errcode = 'P0099', message = n::text;
    exception when sqlstate 'P0099' then
        return sqlerrm::integer;
    end;
end $$;

-- As the service identity of a tenant (what the derive service binds to write models).
create function pg_temp.as_service(p_org text) returns void language plpgsql as $$
begin
    perform set_config('role', 'engram_app', true);
    perform auth.bind_service_identity(p_org, array['team']);
end $$;

-- Documents written by the fixture (the superuser): their chunks' df deltas, one per tenant
-- and scope set, are folded at once by the worker, so lexical_terms has a row of each.
select tests.make_document('t-pn-a', 'team.md', array['team'], 'alpha river') is not null as doc;
select tests.make_document('t-pn-a', 'exec.md', array['exec'], 'secret river') is not null as doc;
select tests.make_document('t-pn-b', 'b.md', array['team'], 'beta river') is not null as doc;
set local role engram_worker;
select recall.fold_lexical_terms(1, pg_temp.a()) = 1 and recall.fold_lexical_terms(1, pg_temp.b()) = 1 as folded;
reset role;

-- provenance.receipt_queue: written by the receipts' trigger, drained by chain_receipts.
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select lives_ok($$insert into provenance.receipts (question_hash, evidence, rendered_hash)
                  values (sha256('q'), '[]', sha256('r'))$$,
                'receipt_queue: alice''s receipt is queued by its trigger, which writes the queue as the owner '
                '[policy receipt_queue__all_owner allow]');
reset role;
select is(pg_temp.count_as('engram_owner', format(
              'select count(*)::int from provenance.receipt_queue where tenant_id = %L', pg_temp.a())), 1,
          'receipt_queue: the owner reads the queued event [policy receipt_queue__all_owner allow]');
grant select, insert, update, delete on provenance.receipt_queue to engram_app;
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select is((select count(*)::int from provenance.receipt_queue), 0,
          'receipt_queue: the application, even with the privilege, sees none of it '
          '[policy receipt_queue__all_owner deny]');
select is(pg_temp.touched('delete from provenance.receipt_queue'), 0,
          'receipt_queue: nor drops a queued event [policy receipt_queue__all_owner deny]');
select throws_ok($$insert into provenance.receipt_queue (tenant_id, id, recorded_at, actor_role, row_hash)
                   values (auth.tenant_id(), uuidv7(), now(), 'engram_app', sha256('forged'))$$,
                 '42501', 'new row violates row-level security policy for table "receipt_queue"',
                 'receipt_queue: nor queues a forged event [policy receipt_queue__all_owner deny]');
reset role;
revoke select, insert, update, delete on provenance.receipt_queue from engram_app;
select tests.act_as('t-pn-b', 'bob', array['team'], array['team']);
select ok(provenance.chain_receipts(1000000) >= 1,
          'receipt_queue: chain_receipts, as the owner, reads and chains the queued event of every tenant '
          '[policy receipt_queue__all_owner allow]');
reset role;
select is((select count(*)::int from provenance.receipt_queue where tenant_id = pg_temp.a()), 0,
          'receipt_queue: and deletes it from the queue [policy receipt_queue__all_owner allow]');

-- recall.lexical_terms: read under the chunks' rule, written only by the fold (the owner).
select tests.act_as('t-pn-a', 'alice', array['team'], '{}');
select is((select sum(chunks)::int from recall.lexical_terms where lexeme = 'alpha'), 1,
          'lexical_terms: a team reader reads the team df [policy lexical_terms__select_app allow]');
select is_empty($$select 1 from recall.lexical_terms where lexeme = 'secret'$$,
                'lexical_terms: not the df of a scope set it cannot read [policy lexical_terms__select_app deny]');
reset role;
select tests.act_as('t-pn-b', 'bob', array['team'], '{}');
select is((select count(*)::int from recall.lexical_terms where tenant_id = pg_temp.a()), 0,
          'lexical_terms: another tenant''s reader sees none of them [policy lexical_terms__select_app deny]');
reset role;
select is(pg_temp.count_as('engram_owner', format(
              'select count(*)::int from recall.lexical_terms where tenant_id = %L and lexeme in (''alpha'', ''secret'')',
              pg_temp.a())), 2,
          'lexical_terms: the owner reads every scope set''s row (the fold wrote them) '
          '[policy lexical_terms__all_owner allow]');
grant insert, update, delete on recall.lexical_terms to engram_app;
select tests.act_as('t-pn-a', 'alice', array['team', 'exec'], array['team', 'exec']);
select throws_ok($$insert into recall.lexical_terms (tenant_id, lexeme, scopes, chunks)
                   values (auth.tenant_id(), 'river', array[tests.scope('t-pn-a', 'team')], 100)$$,
                 '42501', 'new row violates row-level security policy for table "lexical_terms"',
                 'lexical_terms: the application, even with the privilege, cannot forge a df '
                 '[policy lexical_terms__all_owner deny]');
select is(pg_temp.touched('update recall.lexical_terms set chunks = chunks + 100'), 0,
          'lexical_terms: nor change one it reads [policy lexical_terms__all_owner deny]');
select is(pg_temp.touched('delete from recall.lexical_terms'), 0,
          'lexical_terms: nor delete one [policy lexical_terms__all_owner deny]');
reset role;
revoke insert, update, delete on recall.lexical_terms from engram_app;

-- recall.lexical_term_deltas: appended by the chunks' trigger (the owner), folded away.
select is((select count(*)::int from recall.lexical_term_deltas where tenant_id = pg_temp.a()), 0,
          'no delta of the fixture tenant is left after the fold');
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
insert into fx select 'doc', id from sources.documents where path = 'team.md';
select lives_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                  values ((select id from fx where name = 'doc'), 1, 'gamma river', 0, 11)$$,
                'lexical_term_deltas: alice writes a chunk; its trigger appends the delta as the owner '
                '[policy lexical_term_deltas__all_owner allow]');
select is((select count(*)::int from recall.lexical_term_deltas where 'gamma' = any(lexemes)), 1,
          'lexical_term_deltas: a team reader reads the team delta [policy lexical_term_deltas__select_app allow]');
reset role;
select tests.act_as('t-pn-a', 'carol', array['exec'], array['exec']);
select lives_ok($$insert into sources.documents (collection, path, title, body, scopes)
                  values ('notes', 'exec2.md', 'exec2', 'delta', array[tests.scope('t-pn-a', 'exec')])$$,
                'carol writes an exec document');
insert into fx select 'exec doc', id from sources.documents where path = 'exec2.md';
select lives_ok($$insert into sources.chunks (document_id, ordinal, text, char_start, char_end)
                  values ((select id from fx where name = 'exec doc'), 0, 'hidden words', 0, 12)$$,
                'and an exec chunk');
reset role;
select is(pg_temp.count_as('engram_owner', format(
              'select count(*)::int from recall.lexical_term_deltas where tenant_id = %L', pg_temp.a())), 2,
          'lexical_term_deltas: the owner reads both scope sets'' deltas [policy lexical_term_deltas__all_owner allow]');
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select is_empty($$select 1 from recall.lexical_term_deltas where 'hidden' = any(lexemes)$$,
                'lexical_term_deltas: not the delta of a scope set it cannot read '
                '[policy lexical_term_deltas__select_app deny]');
reset role;
select tests.act_as('t-pn-b', 'bob', array['team'], '{}');
select is((select count(*)::int from recall.lexical_term_deltas where tenant_id = pg_temp.a()), 0,
          'lexical_term_deltas: another tenant''s reader sees none of them '
          '[policy lexical_term_deltas__select_app deny]');
reset role;
grant insert, update, delete on recall.lexical_term_deltas to engram_app;
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select throws_ok($$insert into recall.lexical_term_deltas (tenant_id, scopes, sign, lexemes)
                   values (auth.tenant_id(), array[tests.scope('t-pn-a', 'team')], 1, array['river'])$$,
                 '42501', 'new row violates row-level security policy for table "lexical_term_deltas"',
                 'lexical_term_deltas: the application, even with the privilege, cannot append a delta '
                 '[policy lexical_term_deltas__all_owner deny]');
select is(pg_temp.touched('delete from recall.lexical_term_deltas'), 0,
          'lexical_term_deltas: nor remove one it reads [policy lexical_term_deltas__all_owner deny]');
reset role;
revoke insert, update, delete on recall.lexical_term_deltas from engram_app;
set local role engram_worker;
select is(recall.fold_lexical_terms(1, pg_temp.a()), 1, 'the worker folds the tenant''s deltas again');
reset role;
select is((select count(*)::int from recall.lexical_term_deltas where tenant_id = pg_temp.a()), 0,
          'lexical_term_deltas: the fold, as the owner, deleted them [policy lexical_term_deltas__all_owner allow]');

-- memory.rank_models: written by the tenant's service identity, read by every user of it.
select pg_temp.as_service('t-pn-a');
select lives_ok($$with m as (insert into memory.rank_models (version, artifact, sha256, feature_version, card,
                                 events, training_rows, positives, position_bias, active, activated_at)
                             values (1, 'tree', sha256('tree'::bytea), 'f1', '{}', 1, 1, 1, 'none', true, now())
                             returning id)
                  insert into fx select 'model', id from m$$,
                'rank_models: the service writes a model [policy rank_models__insert_app allow]');
select is(pg_temp.touched('update memory.rank_models set active = false, activated_at = null'), 1,
          'rank_models: and deactivates it [policy rank_models__update_app allow]');
reset role;
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select is((select count(*)::int from memory.rank_models), 1,
          'rank_models: every user of the tenant reads it [policy rank_models__select_app allow]');
select throws_ok($$insert into memory.rank_models (version, artifact, sha256, feature_version, card, events,
                       training_rows, positives, position_bias)
                   values (2, 'tree', sha256('tree'::bytea), 'f1', '{}', 1, 1, 1, 'none')$$,
                 '42501', 'new row violates row-level security policy for table "rank_models"',
                 'rank_models: an ordinary user cannot write one [policy rank_models__insert_app deny]');
select is(pg_temp.touched('update memory.rank_models set active = false, activated_at = null'), 0,
          'rank_models: nor deactivate one [policy rank_models__update_app deny]');
reset role;
select pg_temp.as_service('t-pn-b');
select is(pg_temp.touched('update memory.rank_models set active = false, activated_at = null'), 0,
          'rank_models: another tenant''s service changes nothing of it [policy rank_models__update_app deny]');
reset role;
select tests.act_as('t-pn-b', 'bob', array['team'], array['team']);
select is((select count(*)::int from memory.rank_models where tenant_id = pg_temp.a()), 0,
          'rank_models: another tenant''s user reads none of it [policy rank_models__select_app deny]');
reset role;

-- memory.rank_events: the user it records reads it; the owner's functions read the tenant's.
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select lives_ok($$insert into memory.rank_events (operation, channel, model, model_id, feature_version,
                      question_hash, item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                  values ('recall', 'python', 'learned', (select id from fx where name = 'model'), 'f1', sha256('q'),
                          array['sources.documents'], array[(select id from fx where name = 'doc')],
                          array[(select id from fx where name = 'doc')], array[1], 1, array[0.5]::real[])$$,
                'rank_events: alice records her recall [policy rank_events__insert_app allow]');
select is((select count(*)::int from memory.rank_events), 1,
          'rank_events: and reads it [policy rank_events__select_app allow]');
reset role;
grant insert (user_id) on memory.rank_events to engram_app;
select tests.act_as('t-pn-a', 'alice', array['team'], array['team']);
select throws_ok($$insert into memory.rank_events (user_id, operation, channel, model, feature_version,
                       question_hash, item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                   values ('bob', 'recall', 'python', 'm', 'f1', sha256('q'), '{}', '{}', '{}', '{}', 1, '{}')$$,
                 '42501', 'new row violates row-level security policy for table "rank_events"',
                 'rank_events: even given the column, alice cannot record a recall as bob '
                 '[policy rank_events__insert_app deny]');
reset role;
revoke insert (user_id) on memory.rank_events from engram_app;
select tests.act_as_nobody();
select throws_ok($$insert into memory.rank_events (operation, channel, model, feature_version,
                       question_hash, item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                   values ('recall', 'python', 'm', 'f1', sha256('q'), '{}', '{}', '{}', '{}', 1, '{}')$$,
                 '42501', 'new row violates row-level security policy for table "rank_events"',
                 'rank_events: nor can a session with no identity record one [policy rank_events__insert_app deny]');
reset role;
select tests.act_as('t-pn-a', 'bob', array['team'], array['team']);
select is((select count(*)::int from memory.rank_events), 0,
          'rank_events: another user of the tenant reads none of alice''s [policy rank_events__select_app deny]');
select lives_ok($$insert into memory.rank_events (operation, channel, model, feature_version, question_hash,
                      item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                  values ('recall', 'python', 'default', 'f1', sha256('q'), '{}', '{}', '{}', '{}', 1, '{}')$$,
                'bob records a recall of his own');
reset role;
select tests.act_as('t-pn-b', 'alice', array['team'], array['team']);
select is((select count(*)::int from memory.rank_events where tenant_id = pg_temp.a()), 0,
          'rank_events: a user of another tenant reads none [policy rank_events__select_app deny]');
reset role;
select pg_temp.as_service('t-pn-a');
select is((select count(*)::int from memory.rank_training_rows(null, interval '1 hour')), 2,
          'rank_events: rank_training_rows, as the owner, reads every user''s events of the service''s tenant '
          '[policy rank_events__select_owner allow]');
reset role;
select set_config('engram.tenant_id', pg_temp.a()::text, true) is not null as bound;
select is(pg_temp.count_as('engram_owner', 'select count(*)::int from memory.rank_events'), 2,
          'rank_events: the owner reads the bound tenant''s events [policy rank_events__select_owner allow]');
select set_config('engram.tenant_id', pg_temp.b()::text, true) is not null as bound;
select is(pg_temp.count_as('engram_owner', format(
              'select count(*)::int from memory.rank_events where tenant_id = %L', pg_temp.a())), 0,
          'rank_events: the owner bound to another tenant reads none of them [policy rank_events__select_owner deny]');
select set_config('engram.tenant_id', '', true) is not null as unbound;
select is(pg_temp.count_as('engram_owner', 'select count(*)::int from memory.rank_events'), 0,
          'rank_events: nor the owner with no tenant bound [policy rank_events__select_owner deny]');

select * from finish();
rollback;
