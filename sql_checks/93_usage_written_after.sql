-- A recall's usage event is written moments after the recall (0083_usage_written_after):
-- rank_training_rows labels an item used when its user's mark_used came within the label
-- window of the event, counting from ten seconds before the event was written (feedback sent
-- right after the recall can be stamped before its event); feedback from longer before is
-- not a label for it.
begin;
select plan(2);

select tests.make_tenant('t-uw', array['team']) is not null as made;
create temp table ids as
    select tests.make_document('t-uw', 'a.md', array['team']) as doc_a,
           tests.make_document('t-uw', 'b.md', array['team']) as doc_b,
           tests.make_document('t-uw', 'c.md', array['team']) as doc_c;
grant select on ids to public;

select tests.act_as('t-uw', 'alice', array['team'], '{}');
insert into memory.rank_events (operation, channel, model, feature_version, question_hash,
    item_tables, item_ids, document_ids, served_ranks, feature_count, features)
select 'recall', 'python', 'default test', 'f1', sha256('q'::bytea),
       array['sources.chunks', 'sources.chunks', 'sources.chunks'], array[uuidv7(), uuidv7(), uuidv7()],
       array[doc_a, doc_b, doc_c], array[1, 2, 3], 1, array[0.5, 1, 2]::real[]
  from ids;
reset role;
-- As the superuser, who may set the time: alice's feedback on a 5 s before the event was
-- written, on b 20 s before it, on c 30 minutes after it.
insert into memory.usage_ledger (tenant_id, user_id, operation, channel, item_table, item_id, occurred_at)
select e.tenant_id, 'alice', 'mark_used', 'python', 'sources.documents', d.doc, e.occurred_at + d.shift
  from memory.rank_events e,
       (select doc_a as doc, interval '-5 seconds' as shift from ids
        union all select doc_b, interval '-20 seconds' from ids
        union all select doc_c, interval '30 minutes' from ids) d
 where e.model = 'default test' and e.user_id = 'alice';

select tests.act_as('t-uw', 'alice', array['team'], '{}');
select results_eq($$select used from memory.rank_training_rows(null, interval '1 hour')$$,
                  $$values (array[true, false, true])$$,
                  'rank_training_rows: feedback up to 10 s before the event''s write labels it; 20 s before does not');
select results_eq($$select used from memory.rank_training_rows(null, interval '10 minutes')$$,
                  $$values (array[true, false, false])$$,
                  'rank_training_rows: feedback after the label window does not label it');
reset role;
select * from finish();
rollback;
