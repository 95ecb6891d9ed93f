-- Extraction records under forced RLS: they carry their chunk's scope set and
-- read and write with the standard scoped rule (allow and deny per command).
begin;
select plan(8);

select tests.make_tenant('t-ex-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-ex-b', array['team']) is not null as made;
create temp table ids as select tests.make_document('t-ex-a', 'team.md', array['team']) as doc;
create temp table chunk as select c.id from sources.chunks c where c.document_id = (select doc from ids);
grant select on ids, chunk to public;

create function pg_temp.ins(p_scopes text[]) returns void language sql as $$
    insert into memory.extractions (chunk_id, content_hash, scopes, model)
    values ((select id from chunk), '\x00', tests.scopes('t-ex-a', p_scopes), 'test-model')
$$;

select tests.act_as('t-ex-a', 'alice', array['exec'], array['team']);
select throws_ok('select pg_temp.ins(array[''exec''])', '42501', null,
                 'extractions: insert deny into a read-only scope');
select lives_ok('select pg_temp.ins(array[''team''])', 'extractions: insert allow with write on the scope');
select throws_ok($$insert into memory.extractions (tenant_id, chunk_id, content_hash, scopes, model)
                   values (tests.tenant('t-ex-b'), (select id from chunk), '\x00',
                           tests.scopes('t-ex-a', array['team']), 'm')$$, '42501', null,
                 'extractions: insert deny for tenant_id (no column grant)');
reset role;
select tests.act_as('t-ex-a', 'bob', array['team'], '{}');
select is((select count(*)::int from memory.extractions), 1, 'extractions: select allow with read');
reset role;
select tests.act_as('t-ex-a', 'bob', array['exec'], '{}');
select is_empty('select 1 from memory.extractions', 'extractions: select deny in another scope');
reset role;
select tests.act_as('t-ex-a', 'bob', array['team'], '{}');
select lives_ok('update memory.extractions set model = ''x''', 'extractions: update by a reader runs...');
reset role;
select is((select model from memory.extractions where tenant_id = tests.tenant('t-ex-a')), 'test-model', '...and changes nothing (update deny)');
select tests.act_as('t-ex-b', 'alice', array['team'], array['team']);
select is_empty('select 1 from memory.extractions', 'extractions: select deny in another tenant');
reset role;

select * from finish();
rollback;
