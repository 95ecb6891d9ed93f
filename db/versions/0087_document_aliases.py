"""Which note gave an entity each of its aliases, so an alias the note no longer gives goes.

Why: a note's front matter aliases (Obsidian's ``aliases: [Priya, PR]`` on "Priya Raman")
become aliases of the entity its title names (stop 35), and an alias added to the front
matter later is taken (stop 37). But one removed from it, a note renamed to another person,
or the note deleted left the alias on the entity for good: "PR" kept seeding Priya Raman
after the note stopped saying so, and resolution kept matching it.

What changes: ``knowledge.entities.given_aliases``, a JSON object from a document's id to
the aliases that document's front matter gave the entity (as written). Extraction keeps it
(``orchestrator.ingest.aliases.give_document_aliases``): when it reads a note again it
replaces the note's entry, and an alias that no document gives any longer leaves the
entity's ``aliases``; deleting a document (``delete_document``: the API, MCP, the client,
``engram ingest`` for a file gone) and a document that opts out of extraction withdraw its
entry the same way. A note owns only the aliases it added, or that another note gave
already: an alias the entity had without a note (given by hand, a first name read from the
text) is never removed by a note. A GIN index finds the entities a document gave aliases to.

Aliases taken before this revision: the migration gives each note with front matter aliases
(and extraction on) the entity its title names by name (the entity of that name shared into
exactly the note's scopes, a person first: the rule extraction applies first) and records as
the note's the aliases of its front matter that entity has, so an alias taken out after the
upgrade goes too; one also given by hand counts as the note's. A title extraction read as a
name of another spelling ("Dr. Priya Raman") is not matched here: that note's earlier
aliases stay the entity's own for good (reading the note again cannot tell them from ones
given by hand), and only what it adds from now on is its.

Every entity's row image (``to_jsonb``, what its chain events hash) gains the column: the
matched entities get an UPDATE event with their aliases, and ``provenance.baseline`` appends
a BASELINE event with every entity's new image (as 0081 did when it dropped entity columns),
so ``provenance.verify_rows`` holds and no other row changes (``updated_at`` stays);
downgraded, the column goes and the table is baselined again.

``knowledge.merge_entities`` (0004's, two lines patched) carries the merged entity's
record to the survivor with its aliases (per document, the union of both) and clears the
merged-away row's, so a note's aliases stay its own after a merge.

``engram_app`` may update the column (it writes only what its write scopes allow, as for
``aliases``).

Revision ID: 0087_document_aliases
Revises: 0086_task_words
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import context, op

revision = "0087_document_aliases"
down_revision = "0086_task_words"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")

UPGRADE_SQL = """
alter table knowledge.entities add column given_aliases jsonb not null default '{}'::jsonb;
alter table knowledge.entities add constraint ck_entities_given_aliases_object
    check (jsonb_typeof(given_aliases) = 'object');
comment on column knowledge.entities.given_aliases is
    'Document id -> the aliases its front matter gave this entity (extraction keeps it; an alias '
    'no document gives any longer leaves aliases).';
create index ix_entities_given_aliases on knowledge.entities using gin (given_aliases);
grant update (given_aliases) on knowledge.entities to engram_app;
"""

# Each note with front matter aliases, the entity its title names, and the aliases of the
# note that entity has (by normalised name, never its own name).
BACKFILL_SQL = """
with notes as (
    select d.tenant_id, d.id, d.title, d.scopes,
           coalesce(d.metadata -> 'aliases', d.metadata -> 'alias') as given
      from sources.documents d
     where jsonb_typeof(coalesce(d.metadata -> 'aliases', d.metadata -> 'alias')) in ('array', 'string')
       and coalesce(d.metadata -> 'extract', 'true'::jsonb) <> 'false'::jsonb
), named as (
    select n.id as document_id, n.given, e.tenant_id, e.id as entity_id, e.name_key, e.alias_keys
      from notes n
      cross join lateral (
          select e.tenant_id, e.id, e.name_key, e.alias_keys from knowledge.entities e
           where e.tenant_id = n.tenant_id and e.merged_into is null
             and e.name_key = knowledge.normalize_name(n.title)
             and e.scopes @> n.scopes and e.scopes <@ n.scopes
           order by (e.entity_type = 'person') desc, e.created_at, e.id limit 1) e
), owned as (
    select m.tenant_id, m.entity_id, m.document_id,
           array_agg(distinct btrim(a.value)) as aliases
      from named m
      cross join lateral jsonb_array_elements_text(
          case jsonb_typeof(m.given) when 'array' then m.given else jsonb_build_array(m.given) end) a
     where knowledge.normalize_name(btrim(a.value)) = any(m.alias_keys)
       and knowledge.normalize_name(btrim(a.value)) <> m.name_key
     group by m.tenant_id, m.entity_id, m.document_id
), given as (
    select tenant_id, entity_id, jsonb_object_agg(document_id::text, to_jsonb(aliases)) as given
      from owned group by tenant_id, entity_id
)
update knowledge.entities e
   set given_aliases = g.given
  from given g
 where e.tenant_id = g.tenant_id and e.id = g.entity_id
"""

# Every entity's row image changed with the column: a BASELINE chain event for each.
BASELINE_SQL = "select provenance.baseline('knowledge.entities'::regclass)"

DOWNGRADE_SQL = """
revoke update (given_aliases) on knowledge.entities from engram_app;
drop index knowledge.ix_entities_given_aliases;
alter table knowledge.entities drop column given_aliases;
"""


# 0004's merge, two statements patched: the survivor takes the merged entity's record of
# which note gave which alias (per document, the union), and the merged-away row keeps none.
MERGE_PATCHES = (
    ("""                       where knowledge.normalize_name(a) is distinct from v_survivor.name_key)
     where tenant_id = v_survivor.tenant_id and id = v_survivor.id;
""",
     """                       where knowledge.normalize_name(a) is distinct from v_survivor.name_key),
           given_aliases = (select coalesce(jsonb_object_agg(u.k, u.v), '{}'::jsonb)
                              from (select g.key as k, jsonb_agg(distinct x.value order by x.value) as v
                                      from (select * from jsonb_each(v_survivor.given_aliases)
                                            union all
                                            select * from jsonb_each(v_merged.given_aliases)) g
                                     cross join lateral jsonb_array_elements(
                                         case jsonb_typeof(g.value) when 'array' then g.value
                                              else '[]'::jsonb end) x
                                     group by g.key) u)
     where tenant_id = v_survivor.tenant_id and id = v_survivor.id;
"""),
    ("""    update knowledge.entities set merged_into = v_survivor.id
     where tenant_id = v_merged.tenant_id and id = v_merged.id;
""",
     """    update knowledge.entities set merged_into = v_survivor.id, given_aliases = '{}'::jsonb
     where tenant_id = v_merged.tenant_id and id = v_merged.id;
"""),
)


def _released_merge() -> str:
    """``knowledge.merge_entities`` as 0004 wrote it (pinned by db/released.sha256), as
    ``create or replace``."""
    script = context.script.get_revision("0004_knowledge")
    assert script is not None
    sql: str = script.module.FUNCTIONS_SQL
    head = "create function knowledge.merge_entities(p_survivor uuid, p_merged uuid) returns uuid"
    start = sql.index(head)
    body = sql[start:sql.index("\n$$;\n", start) + len("\n$$;\n")]
    return body.replace("create function", "create or replace function", 1)


def merge() -> str:
    text = _released_merge()
    for old, new in MERGE_PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"0004's merge_entities does not hold this once: {old[:80]!r}")
        text = text.replace(old, new)
    return text


def _as_superuser(*sql: str) -> None:
    """As the migrating login (a superuser): under forced RLS the owner, with no identity
    bound, sees no tenant's rows (as 0041, 0086). A login that neither is a superuser nor
    bypasses RLS would update nothing, and says so."""
    op.execute("reset role")
    sees_all = op.get_bind().execute(sa.text(
        "select rolsuper or rolbypassrls from pg_roles where rolname = current_user")).scalar()
    if not sees_all:
        log.warning("0087: the migrating login %s cannot see every tenant's entities (neither "
                    "a superuser nor BYPASSRLS): their row images change without a chain event "
                    "(provenance.verify_rows reports them), and aliases taken before this "
                    "revision stay the entities' own",
                    op.get_bind().execute(sa.text("select current_user")).scalar())
    for statement in sql:
        op.execute(statement)
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.execute(UPGRADE_SQL)
    op.execute(merge())
    _as_superuser(BACKFILL_SQL, BASELINE_SQL)


def downgrade() -> None:
    op.execute(_released_merge())
    op.execute(DOWNGRADE_SQL)
    _as_superuser(BASELINE_SQL)
