-- Derive jobs (0011): an episode built from working memory is private to the items'
-- owner by construction; only the derive service (bound by auth.bind_service_identity,
-- never by a token) reads every user's working memory; the worker alone lists tenants;
-- usage refresh writes changes only.
begin;
select plan(35);

select tests.make_tenant('t-de-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-de-b', array['team']) is not null as made;
create temp table items (who text, id uuid);
grant all on items to public;

create function pg_temp.as_service(p_org text, p_scopes text[]) returns void language plpgsql as $$
begin
    perform set_config('role', 'engram_app', true);
    perform auth.bind_service_identity(p_org, p_scopes);
end $$;
create function pg_temp.remember(p_text text) returns void language sql as $$
    with made as (insert into memory.working_memory (session_id, text, scopes)
                  values ('s1', p_text, tests.scopes('t-de-a', array['team'])) returning id)
    insert into items select auth.user_id(), id from made
$$;
create function pg_temp.episode(p_items uuid[]) returns uuid language sql as $$
    insert into memory.episodes (session_id, summary, started_at, ended_at, scopes, source_item_ids)
    values ('s1', 'we talked', now() - interval '1 hour', now(), tests.scopes('t-de-a', array['team']),
            p_items)
    returning id
$$;
create function pg_temp.items_of(p_who text) returns uuid[] language sql as $$
    select array_agg(id order by id) from items where who = p_who
$$;

-- alice and bob each remember something; alice builds an episode of hers
select tests.act_as('t-de-a', 'bob', '{}', array['team']);
select pg_temp.remember('bob''s note');
reset role;
select tests.act_as('t-de-a', 'alice', '{}', array['team']);
select lives_ok($$select pg_temp.remember('alice''s secret plan')$$, 'working memory: alice writes her item');
select lives_ok($$select pg_temp.episode(pg_temp.items_of('alice'))$$,
                'episodes: insert allow of an episode of her own items');
select is((select (private, user_id) from memory.episodes where cardinality(source_item_ids) > 0),
          (true, 'alice'::text), 'episodes: built from working memory, it is private to the items'' owner');
select lives_ok($$select pg_temp.episode('{}')$$, 'episodes: insert allow of a recorded (shared) episode');
select is((select count(*)::int from memory.episodes), 2, 'episodes: select allow, her private one included');
select throws_ok($$select pg_temp.episode(pg_temp.items_of('bob'))$$, '23503', null,
                 'episodes: insert deny of an episode of items she cannot read (bob''s)');
select throws_ok($$insert into memory.episodes (session_id, summary, started_at, ended_at, scopes, private)
                   values ('s1', 'x', now(), now(), tests.scopes('t-de-a', array['team']), true)$$, '42501', null,
                 'episodes: insert deny of the private column (it follows from the items)');
select throws_ok($$insert into memory.episodes (session_id, summary, started_at, ended_at, scopes, user_id)
                   values ('s1', 'x', now(), now(), tests.scopes('t-de-a', array['team']), 'bob')$$, '42501', null,
                 'episodes: insert deny of user_id (nobody records an episode as someone else)');
reset role;

-- bob reads and writes the same scope, yet never sees alice's private episode
select tests.act_as('t-de-a', 'bob', '{}', array['team']);
select is((select count(*)::int from memory.episodes where private), 0,
          'episodes: select deny of another user''s private episode');
select is((select count(*)::int from memory.episodes where not private), 1,
          'episodes: select allow of a shared episode in a readable scope');
select is_empty($$update memory.episodes set summary = 'edited' where private returning id$$,
                'episodes: update deny of another user''s private episode');
select is_empty($$delete from memory.episodes where private returning id$$,
                'episodes: delete deny of another user''s private episode');
select is((select count(*)::int from memory.working_memory), 1, 'working memory: bob sees only his own');
reset role;

-- alice edits her own private episode; a read-only identity or another scope cannot
select tests.act_as('t-de-a', 'alice', '{}', array['team']);
select isnt_empty($$update memory.episodes set summary = 'mine' where private returning id$$,
                  'episodes: update allow of her own private episode');
reset role;
select tests.act_as('t-de-a', 'alice', array['team'], '{}');
select is_empty($$update memory.episodes set summary = 'read-only' where private returning id$$,
                'episodes: update deny of her private episode without write on its scope');
reset role;
select tests.act_as('t-de-a', 'alice', array['exec'], array['exec']);
select is((select count(*)::int from memory.episodes), 0, 'episodes: select deny in another scope, even her own');
reset role;

-- a token whose subject is service:derive is an ordinary user (before any service binding in
-- this transaction, as every request is its own transaction)
select tests.act_as('t-de-a', 'service:derive', '{}', array['team', 'exec']);
select ok(not auth.is_service(), 'service: a token-bound service:derive is not the service');
select is_empty('select 1 from memory.working_memory', 'working memory: select deny for a token named service:derive');
select is((select count(*)::int from memory.episodes where private), 0,
          'episodes: select deny of private episodes for a token named service:derive');
reset role;

-- the derive service
select pg_temp.as_service('t-de-a', array['team', 'exec']);
select ok(auth.is_service(), 'service: bind_service_identity marks the transaction');
select is(auth.user_id(), 'service:derive', 'service: acts as service:derive');
select is((select count(*)::int from memory.working_memory), 2, 'working memory: select allow for the service');
select is((select count(*)::int from memory.episodes where private), 1,
          'episodes: select allow of private episodes for the service');
select lives_ok($$select pg_temp.episode(pg_temp.items_of('bob'))$$,
                'episodes: insert allow for the service, of any user''s items');
select is((select (private, user_id) from memory.episodes where source_item_ids = pg_temp.items_of('bob')),
          (true, 'bob'::text), 'episodes: the service''s episode is private to the items'' owner');
select throws_ok($$select pg_temp.episode(pg_temp.items_of('alice') || pg_temp.items_of('bob'))$$, '22023', null,
                 'episodes: one episode never mixes two users'' items');
select throws_ok($$update memory.episodes set source_item_ids = source_item_ids || pg_temp.items_of('bob')
                    where user_id = 'alice' and private$$, '42501', null,
                 'episodes: an episode cannot take another user''s items');
select is_empty($$update memory.working_memory set text = 'rewritten' returning id$$,
                'working memory: update deny for the service (it only reads)');
reset role;

-- the mark names one tenant: rebinding to another tenant drops it
select pg_temp.as_service('t-de-a', array['team']);
select tests.act_as('t-de-b', 'service:derive', '{}', array['team']);
select ok(not auth.is_service(), 'service: the mark does not follow a rebind to another tenant');
reset role;

-- listing tenants: the worker only
set local role engram_worker;
select is((select scopes from auth.service_tenants() where org_id = 't-de-a'), array['exec', 'team'],
          'service_tenants: the worker lists each tenant with its scope names');
reset role;
select tests.act_as('t-de-a', 'alice', '{}', array['team']);
select throws_ok('select * from auth.service_tenants()', '42501', null,
                 'service_tenants: execute deny for engram_app');
reset role;
set local role engram_worker;
select throws_ok($$select auth.bind_service_identity('t-de-a', array['team'])$$, '42501', null,
                 'bind_service_identity: execute deny for the worker role');
reset role;

-- decision items carry a category; a note does not
select tests.act_as('t-de-a', 'alice', '{}', array['team']);
select throws_ok($$insert into memory.working_memory (session_id, text, scopes, category)
                   values ('s1', 'a note', tests.scopes('t-de-a', array['team']), 'infra')$$, '23514', null,
                 'working memory: a category only on a decision item');
insert into memory.usage_ledger (operation, channel) values ('recall', 'cli');
select is(memory.refresh_usage(current_date), 1, 'refresh_usage: writes the day''s changed row');
select is(memory.refresh_usage(current_date), 0, 'refresh_usage: an unchanged day writes nothing');
reset role;

select * from finish();
rollback;
