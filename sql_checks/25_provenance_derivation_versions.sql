-- Derivation versions written by the app (0019): kept only when each is the current version
-- of a row the writer can see, checked once per statement; anything else refuses the whole
-- statement and stores nothing.
begin;
set constraints all immediate;
select plan(19);

select tests.make_tenant('t-dv-1', array['team', 'exec']);
select tests.make_tenant('t-dv-2', array['team']);
select tests.make_document('t-dv-1', 'a.md', array['team'], 'alpha');
select tests.make_document('t-dv-1', 'b.md', array['team'], 'beta');
select tests.make_document('t-dv-1', 'secret.md', array['exec'], 'secret');
select tests.make_document('t-dv-2', 'other.md', array['team'], 'other');

-- As the superuser: ids and true versions of rows the app will name (some it cannot see).
create temp table dv on commit drop as
select d.path, jsonb_build_object('id', d.id) as did, provenance.row_version('sources.documents',
           jsonb_build_object('id', d.id), d.tenant_id) as dver,
       jsonb_build_object('id', c.id) as cid, provenance.row_version('sources.chunks',
           jsonb_build_object('id', c.id), c.tenant_id) as cver
  from sources.documents d join sources.chunks c on c.document_id = d.id
 where d.tenant_id in (tests.tenant('t-dv-1'), tests.tenant('t-dv-2'));
grant select on dv to engram_app;

select tests.act_as('t-dv-1', 'alice', array['team'], array['team']);
select is((select provenance.current_versions(
              array['sources.documents', 'sources.chunks', 'sources.documents', 'no.such_table',
                    'sources.documents', 'sources.documents'],
              array[a.did, a.cid, s.did, a.did, a.did || '{"extra": 1}', o.did])
             from dv a, dv s, dv o where a.path = 'a.md' and s.path = 'secret.md' and o.path = 'other.md'),
          (select array[a.dver, a.cver, null, null, null, null]::bytea[] from dv a where a.path = 'a.md'),
          'current_versions: element by element; null where the row is unseen, the table unknown, '
          'the id not an id key, or the row another tenant''s');
select throws_ok($$select provenance.current_versions(array['sources.documents'], '{}'::jsonb[])$$,
                 '22023', null, 'current_versions: tables and row ids must pair up');
select is((select provenance.current_versions(array_fill('sources.documents'::text, array[7]),
              array[a.did, jsonb_build_object('id', upper(a.did ->> 'id')), '{"id": "x"}',
                    a.did || '{"n": 1}', a.did -> 'id', '[]', null])
             from dv a where a.path = 'a.md'),
          (select array[a.dver, null, null, null, null, null, null]::bytea[] from dv a where a.path = 'a.md'),
          'current_versions: only an id that is exactly {"id": <lower-case uuid>} is read in bulk; '
          'any other shape (a scalar, an array, null) gives null, never an error');
select lives_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                       source_table, source_row_id, source_version)
                  select 'sources.chunks', cid, cver, 'sources.documents', did, dver from dv
                   where path in ('a.md', 'b.md')$$,
                'a batch with the current versions written is stored');
select is((select count(*)::int from provenance.derivations d join dv on dv.cid = d.derived_row_id
            where d.derived_version = dv.cver and d.source_version = dv.dver), 2,
          'the stored versions are the rows'' current versions');
select is((select bool_and(recorded_by = 'alice') from provenance.derivations), true,
          'edges with written versions are stamped like any other');

select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id, source_version)
                   select 'sources.chunks', cid, cver, 'sources.documents', did,
                          case when path = 'b.md' then sha256('forged') else dver end from dv
                    where path in ('a.md', 'b.md')$$,
                 '23514', null, 'one forged source version in a batch refuses the statement');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id)
                   select 'sources.chunks', cid, sha256('forged'), 'sources.documents', did from dv
                    where path = 'a.md'$$,
                 '23514', null, 'a forged derived version is refused');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id, source_version)
                   select 'sources.chunks', a.cid, a.cver, 'sources.documents', s.did, s.dver
                     from dv a, dv s where a.path = 'a.md' and s.path = 'secret.md'$$,
                 '23503', null,
                 'the true version of a row in a scope the writer cannot read is refused: not visible');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id, source_version)
                   select 'sources.chunks', a.cid, a.cver, 'sources.documents', s.did, s.dver
                     from dv a, dv s where a.path = 'a.md' and s.path = 'other.md'$$,
                 '23503', null, 'the true version of another tenant''s row is refused');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id)
                   select 'sources.chunks', cid || '{"extra": 1}', cver, 'sources.documents', did from dv
                    where path = 'a.md'$$,
                 '22023', null, 'a row id that is not the table''s key is refused, version written or not');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_agent_id, source_version)
                   select 'sources.chunks', cid, cver, (select id from provenance.agents limit 1), cver
                     from dv where path = 'a.md'$$,
                 '22023', null, 'a derivation from an agent carries no source version');
select is((select count(*)::int from provenance.derivations), 2, 'no refused statement stored an edge');

-- A version read before the row changed is stale by the time it is written.
update sources.documents set title = 'renamed' where path = 'b.md';
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id, source_version)
                   select 'sources.chunks', cid, cver, 'sources.documents', did, dver from dv
                    where path = 'b.md'$$,
                 '23514', null, 'a version from before an update is refused as stale');
select throws_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                        source_table, source_row_id)
                   select 'sources.chunks', jsonb_build_object('id', upper(cid ->> 'id')), sha256('x'),
                          'sources.documents', did from dv where path = 'b.md'$$,
                 '23514', null, 'an id in upper case is checked at once by the row trigger: forged, refused');
select lives_ok($$insert into provenance.derivations (derived_table, derived_row_id, derived_version,
                                                       source_table, source_row_id)
                  select 'sources.chunks', jsonb_build_object('id', upper(cid ->> 'id')), cver,
                         'sources.documents', did from dv where path = 'b.md'$$,
                'an id in upper case with its current version is stored');
select lives_ok($$insert into provenance.derivations (derived_table, derived_row_id, source_table, source_row_id)
                  select 'sources.chunks', cid, 'sources.documents', did from dv where path = 'b.md'$$,
                'without written versions the database pins them as before');
select is((select d.source_version = provenance.row_version('sources.documents', dv.did)
             from provenance.derivations d join dv on dv.did = d.source_row_id
            where dv.path = 'b.md' and d.derived_row_id = dv.cid order by d.recorded_at desc limit 1),
          true, 'the pinned version is the row''s version after the update');
reset role;

select tests.act_as('t-dv-2', 'bob', array['team'], array['team']);
select is_empty('select 1 from provenance.derivations', 'another tenant sees none of these edges');
reset role;

select * from finish();
rollback;
