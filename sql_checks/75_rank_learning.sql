-- Learning to rank (0050): rank_events are readable and writable by the user they record,
-- in their tenant only; rank_models are read by every user of the tenant and written only by
-- the derive service identity; rank_training_rows labels an item by its own user's mark_used
-- feedback, returns the whole tenant to the service and the caller's own events otherwise,
-- and never another tenant's; rank_models is chained.
begin;
select plan(24);

select tests.make_tenant('t-rl-a', array['team']) is not null as made;
select tests.make_tenant('t-rl-b', array['team']) is not null as made;
create temp table ids as select tests.make_document('t-rl-a', 'a.md', array['team']) as doc_a;
grant select on ids to public;

create function pg_temp.as_service(p_org text) returns void language plpgsql as $$
begin
    perform set_config('role', 'engram_app', true);
    perform auth.bind_service_identity(p_org, array['team']);
end $$;
create function pg_temp.event(p_doc uuid, p_rank integer) returns uuid language sql as $$
    insert into memory.rank_events (operation, channel, model, feature_version, question_hash,
        item_tables, item_ids, document_ids, served_ranks, feature_count, features)
    values ('recall', 'python', 'default test', 'f1', sha256('q'::bytea),
            array['sources.chunks', 'memory.profiles'], array[uuidv7(), uuidv7()],
            array[p_doc, null], array[p_rank, 0], 2, array[0.5, 1, 0.25, 2]::real[])
    returning id
$$;

select ok(exists (select 1 from provenance.chained_tables() t where t = 'memory.rank_models'::regclass),
          'rank_models is chained (provenance for every model written or activated)');

-- rank_events: the user's own rows
select tests.act_as('t-rl-a', 'alice', array['team'], '{}');
select lives_ok($$select pg_temp.event((select doc_a from ids), 1)$$, 'rank_events: insert allow as the user');
select throws_ok($$insert into memory.rank_events (user_id, operation, channel, model, feature_version,
                       question_hash, item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                   values ('bob', 'recall', 'python', 'm', 'f1', sha256('q'::bytea), '{}', '{}', '{}', '{}', 1, '{}')$$,
                 '42501', null, 'rank_events: insert deny for another user''s row');
select throws_ok($$insert into memory.rank_events (operation, channel, model, feature_version, question_hash,
                       item_tables, item_ids, document_ids, served_ranks, feature_count, features)
                   values ('recall', 'python', 'm', 'f1', sha256('q'::bytea), array['t'], array[uuidv7()],
                           array[null::uuid], array[1], 2, array[1]::real[])$$,
                 '23514', null, 'rank_events: features must be feature_count per item');
select is((select count(*)::int from memory.rank_events), 1, 'rank_events: select allow for the user');
insert into memory.usage_ledger (operation, channel, item_table, item_id)
values ('mark_used', 'python', 'sources.documents', (select doc_a from ids));
select results_eq($$select used from memory.rank_training_rows(null, interval '1 hour')$$,
                  $$values (array[true, false])$$,
                  'rank_training_rows: the excerpt is labelled used through its document');
select throws_ok($$select * from memory.rank_training_rows(null, interval '0')$$, '22023', null,
                 'rank_training_rows: refuses an empty label window');
select throws_ok($$update memory.rank_events set model = 'x'$$, '42501', null,
                 'rank_events: update deny');
select throws_ok($$delete from memory.rank_events$$, '42501', null, 'rank_events: delete deny');
reset role;
select tests.act_as('t-rl-a', 'bob', array['team'], '{}');
select is_empty('select 1 from memory.rank_events', 'rank_events: select deny for another user');
select is_empty($$select 1 from memory.rank_training_rows(null, interval '1 hour')$$,
                'rank_training_rows: an ordinary user gets only their own events');
select lives_ok($$select pg_temp.event(null, 1)$$, 'rank_events: bob records his own recall');
reset role;
select tests.act_as('t-rl-b', 'alice', array['team'], '{}');
select is_empty('select 1 from memory.rank_events', 'rank_events: select deny in another tenant');
reset role;
select pg_temp.as_service('t-rl-b');
select is_empty($$select 1 from memory.rank_training_rows(null, interval '1 hour')$$,
                'rank_training_rows: the service of another tenant gets nothing of this one');
reset role;
select pg_temp.as_service('t-rl-a');
select is((select count(*)::int from memory.rank_training_rows(null, interval '1 hour')), 2,
          'rank_training_rows: the service reads every user''s events of its tenant');

-- rank_models: the service writes, every user reads
select lives_ok($$insert into memory.rank_models (version, artifact, sha256, feature_version, card, events,
                      training_rows, positives, position_bias, active, activated_at)
                  values (1, 'tree', sha256('tree'::bytea), 'f1', '{}', 10, 100, 12, 'unbiased', true, now())$$,
                'rank_models: insert allow for the service');
select throws_ok($$insert into memory.rank_models (version, artifact, sha256, feature_version, card, events,
                       training_rows, positives, position_bias, active, activated_at)
                   values (2, 'tree', sha256('tree'::bytea), 'f1', '{}', 1, 1, 1, 'x', true, now())$$,
                 '23505', null, 'rank_models: at most one active model per tenant');
reset role;
select tests.act_as('t-rl-a', 'alice', array['team'], '{}');
select is((select version from memory.rank_models where active), 1, 'rank_models: select allow for a user');
select throws_ok($$insert into memory.rank_models (version, artifact, sha256, feature_version, card, events,
                       training_rows, positives, position_bias)
                   values (3, 'tree', sha256('tree'::bytea), 'f1', '{}', 1, 1, 1, 'x')$$,
                 '42501', null, 'rank_models: insert deny for an ordinary user');
update memory.rank_models set active = false, activated_at = null;
select is((select count(*)::int from memory.rank_models where active), 1,
          'rank_models: update deny for an ordinary user (no row changes)');
select throws_ok($$update memory.rank_models set artifact = 'other'$$, '42501', null,
                 'rank_models: the artifact never changes');
reset role;
select tests.act_as('t-rl-b', 'alice', array['team'], '{}');
select is_empty('select 1 from memory.rank_models', 'rank_models: select deny in another tenant');
reset role;
select tests.act_as_nobody();
select is_empty('select 1 from memory.rank_models', 'rank_models: select deny without an identity');
select throws_ok($$select * from memory.rank_training_rows(null, interval '1 hour')$$, '28000', null,
                 'rank_training_rows: refuses without an identity');

select * from finish();
rollback;
