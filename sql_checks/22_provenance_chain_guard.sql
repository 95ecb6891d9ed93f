-- Catalog guard: every tenant table in the memory schemas (sources, knowledge,
-- memory) and the provenance tables has the three chain triggers, so a future
-- table that forgets provenance.attach_chain fails here. Also the trigger
-- function's own safety properties.
begin;
select plan(7);

create temp view chain_candidates as
    select c.oid::regclass as tbl from pg_class c join pg_namespace n on n.oid = c.relnamespace
     where n.nspname in ('sources', 'knowledge', 'memory', 'provenance')
       and c.relkind in ('r', 'p') and not c.relispartition
       and c.oid not in ('provenance.events'::regclass, 'provenance.pending'::regclass,
                         'provenance.pending_commits'::regclass, 'provenance.receipt_queue'::regclass)
       and exists (select 1 from pg_attribute a where a.attrelid = c.oid and a.attname = 'tenant_id'
                      and not a.attisdropped);

select ok((select count(*) from chain_candidates) >= 6, 'documents, chunks and the provenance tables are candidates');

select is_empty($$
    select c.tbl::text || ' lacks ' || ev from chain_candidates c
     cross join unnest(array['INSERT', 'UPDATE', 'DELETE']) as ev
     where not exists (
        -- Receipts chain their INSERTs through the queue of 0040 (chain_receipts appends them).
        select 1 from pg_trigger t where t.tgrelid = c.tbl and not t.tgisinternal
           and (t.tgfoid = 'provenance.tg_chain__append()'::regprocedure
                or (c.tbl = 'provenance.receipts'::regclass and ev = 'INSERT'
                    and t.tgfoid = 'provenance.tg_receipts__queue_chain()'::regprocedure))
           and t.tgenabled = 'O'
           and (t.tgtype & 1) = 0  -- statement level
           and (t.tgtype & 2) = 0  -- after
           and case ev when 'INSERT' then (t.tgtype & 4) <> 0 when 'DELETE' then (t.tgtype & 8) <> 0
                       else (t.tgtype & 16) <> 0 end)
$$, 'every memory table appends to the chain on INSERT, UPDATE and DELETE (enabled, after, per statement)');

select is_empty($$
    select c.tbl::text from chain_candidates c
     where not exists (select 1 from pg_policy p where p.polrelid = c.tbl
                          and p.polname like '%__select_verifier')
$$, 'the verifier may hash the rows of every chained table');

select is_empty($$
    select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace
     where n.nspname in ('sources', 'knowledge', 'memory') and c.relkind in ('r', 'p')
       and not exists (select 1 from pg_attribute a where a.attrelid = c.oid and a.attname = 'tenant_id')
$$, 'no memory table escapes the per-tenant chain by lacking tenant_id');

select ok((select prosecdef and pg_get_userbyid(proowner) = 'engram_owner'
             from pg_proc where oid = 'provenance.tg_chain__append()'::regprocedure),
          'the chain trigger runs as engram_owner (security definer)');
select ok(not has_function_privilege('engram_app', 'provenance.tg_chain__append()', 'execute')
          and not has_function_privilege('engram_app', 'provenance.append_events(text, text, text[], jsonb[])', 'execute'),
          'no writer can attach the chain function to a table of its own, or append directly');
select ok((select bool_and(coalesce(proconfig, '{}') @> array['search_path=pg_catalog, pg_temp'])
             from pg_proc p join pg_namespace n on n.oid = p.pronamespace
            where n.nspname = 'provenance' and p.prokind = 'f' and p.proname <> 'event_body'),
          'every provenance function pins search_path (event_body is inlined, fully qualified)');

select * from finish();
rollback;
