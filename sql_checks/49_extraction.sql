-- Extraction (0018): deleting a chunk (an edit re-chunks, a document delete cascades)
-- ends the record time of the claims extracted from it, and of nothing else; a crafted
-- extraction record cannot retract claims its writer could not. intern_contents interns
-- like intern_content; conflict detection skips only where no shape could find one.
begin;
\ir helpers_knowledge.sql
select plan(20);

select tests.make_tenant('t-xr-a', array['team', 'exec']) is not null as made;
select tests.make_tenant('t-xr-b', array['team']) is not null as made;
create temp table ids as
    select tests.make_document('t-xr-a', 'a.md', array['team'], 'Ada works at Acme.') as doc_a,
           tests.make_document('t-xr-a', 'b.md', array['team'], 'Ada lives in Lisbon.') as doc_b,
           tests.make_document('t-xr-b', 'c.md', array['team'], 'Ada likes tea.') as doc_c,
           tests.k_entity('t-xr-a', 'person', 'Ada', array['team', 'exec']) as ada,
           tests.k_entity('t-xr-b', 'person', 'Ada', array['team']) as ada_b;
create temp table claims (name text, id uuid);
grant all on ids, claims to public;

create function pg_temp.chunk(p_doc uuid) returns uuid language sql as $$
    select id from sources.chunks where document_id = p_doc
$$;
-- As the extractor writes them (Python's assert_facts): role extractor, low confidence.
create function pg_temp.claim(p_name text, p_subject uuid, p_org text, p_scopes text[]) returns void
    language sql as $$
    with c as (
        insert into knowledge.fact_claim (content_id, subject_id, predicate, object_value, object_datatype,
                                          scopes, author_role, confidence)
        values (knowledge.intern_content('Ada works at ' || p_name), p_subject, 'works_at', p_name, 'string',
                tests.scopes(p_org, p_scopes), 'extractor', 0.3)
        returning id)
    insert into claims select p_name, id from c
$$;
create function pg_temp.record(p_org text, p_doc uuid, p_names text[]) returns void language sql as $$
    insert into memory.extractions (chunk_id, content_hash, scopes, model, claim_ids)
    values (pg_temp.chunk(p_doc), '\x00', tests.scopes(p_org, array['team']), 'test',
            (select array_agg(id) from claims where name = any(p_names)))
$$;
create function pg_temp.current(p_name text) returns boolean language sql as $$
    select c.superseded_at is null from knowledge.fact_claim c join claims n on n.id = c.id
     where n.name = p_name
$$;
grant execute on all functions in schema pg_temp to public;

-- The extractor (alice, write on team) read a.md and b.md; an exec claim someone else wrote
-- is listed by a crafted record of a.md; bob in tenant b has his own.
select tests.act_as('t-xr-a', 'alice', '{}', array['team']);
select pg_temp.claim('a1', (select ada from ids), 't-xr-a', array['team']);
select pg_temp.claim('a2', (select ada from ids), 't-xr-a', array['team']);
select pg_temp.claim('b1', (select ada from ids), 't-xr-a', array['team']);
reset role;
select tests.act_as('t-xr-a', 'carol', '{}', array['team', 'exec']);
select pg_temp.claim('x1', (select ada from ids), 't-xr-a', array['exec']);
reset role;
select tests.act_as('t-xr-a', 'alice', array['exec'], array['team']);
select pg_temp.record('t-xr-a', (select doc_a from ids), array['a1', 'a2', 'x1']);
select pg_temp.record('t-xr-a', (select doc_b from ids), array['b1']);
reset role;
select tests.act_as('t-xr-b', 'bob', '{}', array['team']);
select pg_temp.claim('c1', (select ada_b from ids), 't-xr-b', array['team']);
reset role;
select tests.act_as('t-xr-b', 'bob', '{}', array['team']);
select pg_temp.record('t-xr-b', (select doc_c from ids), array['c1']);
reset role;

-- deny: a reader cannot delete the chunk, so nothing is retracted
select tests.act_as('t-xr-a', 'dave', array['team'], '{}');
select lives_ok($$delete from sources.chunks where id = pg_temp.chunk((select doc_a from ids))$$,
                'retract: a reader''s chunk delete runs...');
reset role;
select ok(pg_temp.current('a1') and pg_temp.current('a2'), '...and retracts nothing (deny)');

-- allow: the writer's edit deletes the chunk: its own claims stop being current
select tests.act_as('t-xr-a', 'alice', array['exec'], array['team']);
select lives_ok($$delete from sources.chunks where id = pg_temp.chunk((select doc_a from ids))$$,
                'retract: a writer deletes the chunk');
reset role;
select ok(not pg_temp.current('a1') and not pg_temp.current('a2'), 'retract: the chunk''s claims are superseded');
select ok(pg_temp.current('x1'), 'retract: a claim outside the record''s scope set stays (crafted record deny)');
select ok(pg_temp.current('b1'), 'retract: another chunk''s claims stay');
select is((select count(*)::int from knowledge.fact_claim where id in (select id from claims)), 5,
          'retract: nothing is deleted');
select is((select count(*)::int from memory.extractions where tenant_id = tests.tenant('t-xr-a')), 1,
          'retract: the deleted chunk''s record went with it');

-- allow: deleting the document cascades to its chunk and retracts
select tests.act_as('t-xr-a', 'alice', array['exec'], array['team']);
select lives_ok($$delete from sources.documents where id = (select doc_b from ids)$$,
                'retract: a writer deletes a document');
reset role;
select ok(not pg_temp.current('b1'), 'retract: a document delete retracts its chunks'' claims');

-- deny: another tenant's delete never reaches this tenant, and its own works
select tests.act_as('t-xr-b', 'bob', '{}', array['team']);
select lives_ok($$delete from sources.documents where id = (select doc_c from ids)$$,
                'retract: tenant b deletes its document');
reset role;
select ok(not pg_temp.current('c1') and pg_temp.current('x1'),
          'retract: tenant b''s claim retracted, tenant a''s untouched');

-- intern_contents: the same ids as intern_content, once per text, for a bound identity only
select tests.act_as('t-xr-a', 'alice', '{}', array['team']);
select is((select count(*)::int from knowledge.intern_contents(array['x one', 'x two', 'x one'])), 2,
          'intern_contents: one row per distinct text');
select is((select content_id from knowledge.intern_contents(array['x one'])),
          knowledge.intern_content('x one'), 'intern_contents: the id intern_content gives');
select throws_ok($$select * from knowledge.intern_contents(array['ok', ' '])$$, '22023', null,
                 'intern_contents: an empty text refuses the batch');
reset role;
select tests.act_as_nobody();
select throws_ok($$select * from knowledge.intern_contents(array['x'])$$, '28000', null,
                 'intern_contents: deny without a bound identity');
reset role;
set local role engram_worker;
select throws_ok($$select * from knowledge.intern_contents(array['x'])$$, '42501', null,
                 'intern_contents: deny to roles without the grant');
reset role;

-- conflicts on write: none without a functional shape; with one, the write finds them
-- and the sweep finds the pair written before it
select tests.act_as('t-xr-a', 'alice', '{}', array['team']);
select pg_temp.claim('Initech', (select ada from ids), 't-xr-a', array['team']);
select pg_temp.claim('Hooli', (select ada from ids), 't-xr-a', array['team']);
reset role;
select is((select count(*)::int from knowledge.conflicts where tenant_id = tests.tenant('t-xr-a')), 0,
          'conflicts: no shape, no conflict (the fast path)');
select tests.k_shape('t-xr-a', 'works_at', 1) is not null as shaped;
select tests.act_as('t-xr-a', 'alice', '{}', array['team']);
select is(knowledge.detect_conflicts(), 1, 'conflicts: the sweep finds the pair written before the shape');
select pg_temp.claim('Globex', (select ada from ids), 't-xr-a', array['team']);
reset role;
select is((select count(*)::int from knowledge.conflicts where tenant_id = tests.tenant('t-xr-a')), 3,
          'conflicts: under a functional shape the write finds its own');

select * from finish();
rollback;
