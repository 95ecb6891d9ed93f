-- Knowledge tables under forced RLS: allow and deny per table and command,
-- content readable only through a visible claim, fact_content immutable.
begin;
\ir helpers_knowledge.sql
select plan(31);

select tests.make_tenant('t-k-a', array['team', 'private', 'exec']);
select tests.make_tenant('t-k-b', array['team']);
create temp table ids (name text primary key, id uuid);
grant select, insert on ids to public;
insert into ids values
    ('ann', tests.k_entity('t-k-a', 'person', 'Ann Lee', array['team'])),
    ('secret', tests.k_entity('t-k-a', 'person', 'Secret Sam', array['private'])),
    ('bob-b', tests.k_entity('t-k-b', 'person', 'Bob', array['team']));

-- writes as a team writer
select tests.act_as('t-k-a', 'alice', array['private'], array['team']);
insert into ids values ('c-team', tests.k_claim((select id from ids where name = 'ann'), 'role', 'engineer',
                                                 tests.scopes('t-k-a', array['team'])));
select isnt((select id from ids where name = 'c-team'), null, 'insert allow: a claim in a writable scope');
select throws_ok($$select tests.k_claim((select id from ids where name = 'ann'), 'role', 'spy',
                                       tests.scopes('t-k-a', array['private']))$$,
                 '42501', null, 'insert deny: read-only scope attempting a write');
select throws_ok($$select tests.k_claim((select id from ids where name = 'ann'), 'role', 'spy',
                                       tests.scopes('t-k-a', array['team', 'exec']))$$,
                 '42501', null, 'insert deny: write on only some of the row''s scopes');
select throws_ok($$select tests.k_claim((select id from ids where name = 'bob-b'), 'role', 'x',
                                       tests.scopes('t-k-a', array['team']))$$,
                 '23503', null, 'insert deny: a claim about an entity of another tenant');
select throws_ok($$insert into knowledge.entities (entity_type, canonical_name, scopes)
                   values ('person', 'Eve', tests.scopes('t-k-a', array['private']))$$,
                 '42501', null, 'entity insert deny: read-only scope');
select lives_ok($$insert into knowledge.entities (entity_type, canonical_name, scopes)
                  values ('person', 'Eve', tests.scopes('t-k-a', array['team']))$$,
                'entity insert allow: writable scope');
select throws_ok($$insert into knowledge.fact_content (text) values ('direct')$$,
                 '42501', null, 'fact_content: no direct insert (only knowledge.intern_content)');
select throws_ok($$insert into knowledge.shapes (tenant_id, predicate) values (tests.tenant('t-k-a'), 'x')$$,
                 '42501', null, 'shapes: the app cannot define shapes (the DBA does)');
reset role;

-- a private claim by a private writer
select tests.act_as('t-k-a', 'pat', '{}', array['private']);
insert into ids values ('c-private', tests.k_claim((select id from ids where name = 'secret'), 'role',
                                                    'informant', tests.scopes('t-k-a', array['private'])));
reset role;

-- reads
select tests.act_as('t-k-a', 'alice', array['team'], '{}');
select results_eq($$select object_value from knowledge.fact_claim$$, $$values ('engineer')$$,
                  'select allow: only the claim in a readable scope');
select is_empty($$select 1 from knowledge.entities where canonical_name = 'Secret Sam'$$,
                'select deny: an entity in another scope is invisible');
select is_empty($$select 1 from knowledge.fact_content where text like '%informant%'$$,
                'select deny: content of an invisible claim is invisible');
select is((select count(*)::int from knowledge.fact_content), 1, 'select allow: content of a visible claim');
select is((select text from knowledge.current_claims), 'role engineer', 'current_claims joins visible text');
select is((select count(*)::int from knowledge.current_claims), 1, 'the view cannot widen what the caller sees');
select is_empty($$select 1 from knowledge.entities where tenant_id = tests.tenant('t-k-b')$$,
                'select deny: another tenant''s entities are invisible');
select is((select count(*)::int from knowledge.shapes), 0, 'shapes: readable (none defined yet)');
-- update / delete deny for read-only
select is_empty($$update knowledge.fact_claim set disputed = true returning 1$$,
                'update deny: read-only scope changes nothing');
select is_empty($$delete from knowledge.fact_claim returning 1$$, 'delete deny: read-only scope');
select throws_ok($$update knowledge.fact_claim set object_value = 'x'$$, '42501', null,
                 'update deny: claim values have no update grant');
reset role;

select tests.act_as('t-k-a', 'alice', '{}', array['team']);
select results_eq($$update knowledge.fact_claim set valid_to = now() + interval '1 year' returning object_value$$,
                  $$values ('engineer')$$, 'update allow: validity end with write on the scope');
select throws_ok($$update knowledge.fact_content set text = 'rewritten'$$, '42501', null,
                 'fact_content: UPDATE refused for the app');
reset role;
select throws_ok($$update knowledge.fact_content set text = 'rewritten'$$, '42501',
                 'fact content is immutable; assert a new claim with new text instead',
                 'fact_content: UPDATE refused even for the superuser, with the reason');
select is((select count(*)::int from knowledge.fact_content where text = 'rewritten'), 0, 'no text changed');

select tests.act_as('t-k-b', 'bob', array['team'], array['team']);
select is_empty($$select 1 from knowledge.fact_claim$$, 'other tenant: sees no claims');
select is_empty($$select 1 from knowledge.fact_content$$, 'other tenant: sees no content');
select is_empty($$delete from knowledge.entities where tenant_id = tests.tenant('t-k-a') returning 1$$,
                'other tenant: cannot delete');
reset role;

select tests.act_as_nobody();
select is_empty('select 1 from knowledge.fact_claim', 'no identity bound: sees no claims');
select is_empty('select 1 from knowledge.entities', 'no identity bound: sees no entities');
select throws_ok($$select knowledge.intern_content('x')$$, '28000', null,
                 'no identity bound: cannot intern content');
reset role;

select tests.act_as('t-k-a', 'alice', '{}', array['team']);
select lives_ok($$select knowledge.touch_claims(array[(select id from ids where name = 'c-team'),
                                                      (select id from ids where name = 'c-private')])$$,
                'touch_claims runs for a reader');
reset role;
select is((select array_agg(access_count order by object_value) from knowledge.fact_claim
            where tenant_id = tests.tenant('t-k-a')), array[1, 0],
          'touch_claims counts only the claims the caller can read');

select * from finish();
rollback;
