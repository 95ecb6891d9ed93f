"""A chunk knows the section it starts in, so an excerpt says where in its document it is.

Why: a source excerpt named only its document. Over Node.js's changelogs ("what changed in
Node.js 20.5.0?") an excerpt of a release's commits read "Node.js 20 ChangeLog
(nodelog/CHANGELOG_V20.md)" and began with a list of commits: which release it listed was
in a heading one or two chunks up, which the reader never saw. An API reference's excerpt
of options, a runbook's step, a meeting note's action items: each is read by the headings
above it.

What changes: ``sources.chunks.section`` (jsonb), the headings whose sections the chunk
starts in, outermost first, each ``{"level": 1-6, "text": "..."}``: the heading that opens
the chunk is in its text, not its trail, and a first heading that says the document's
title is left out (``orchestrator.markdown.section_trails``; ingest writes it with the
chunk). Null where the chunk starts under no heading. At most six headings (one a level) of
at most 200 characters each, control characters out (checked here: an array of one to six, at
most 8,000 characters as JSON text, room for every heading's quotes escaped). Recall renders the trail after the document's title; the
API serves it as ``SourceRef.section``.

The words of the trail's outermost heading are in the chunk's lexical vector
(``sources.section_words``, added by ``sources.tg_chunks__inherit`` after the text's and the
task words, and counted in the chunk's length): "which npm version ships with Node.js
20.10.0?" finds the commits listed under "Version 20.10.0", which never repeat the number.
The outermost only: a chunk deep in a section already stands near its inner headings' words,
and every heading's words on every chunk under it let a long section about "throwing
JavaScript errors in C++" outrank the page on internal errors (Node.js's contributor guides:
MRR 0.845 -> 0.831 with the whole trail, 0.844 with the outermost heading). Not in the
embedding: a passage's embedding reads its text as before.

Chunks written before this revision get their trail here, computed from their document's
body by the code that ingest runs (imported when there are documents to read, so the trail
is the one ingest would write today), as the migrating login (a superuser: under the
chunks' forced RLS the owner sees none of them; another login updates nothing and says
so). Every chunk's row image gains the column: the updated chunks get an UPDATE event each,
and ``provenance.baseline`` appends a BASELINE event with every chunk's new image (as 0081
and 0087 did), so ``provenance.verify_rows`` holds. Downgraded, the column goes and the
table is baselined again.

Revision ID: 0089_chunk_sections
Revises: 0088_identity_functions_plpgsql
"""

from __future__ import annotations

import json
import logging

import sqlalchemy as sa
from alembic import op

revision = "0089_chunk_sections"
down_revision = "0088_identity_functions_plpgsql"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")

UPGRADE_SQL = """
alter table sources.chunks add column section jsonb;
alter table sources.chunks add constraint ck_chunks_section_shape check (
    section is null or (jsonb_typeof(section) = 'array'
                        and jsonb_array_length(section) between 1 and 6
                        and length(section::text) <= 8000));
comment on column sources.chunks.section is
    'The headings whose sections the chunk starts in, outermost first: [{"level": n, "text": ...}] '
    '(the document''s title and the chunk''s own opening heading left out); null under none.';
grant insert (section) on sources.chunks to engram_app;
grant update (section) on sources.chunks to engram_app;

create function sources.section_words(p_section jsonb) returns tsvector
    language sql immutable parallel safe
    set search_path = pg_catalog, pg_temp
as $$
    select coalesce(to_tsvector('english'::regconfig,
                                case when jsonb_typeof(p_section) = 'array'
                                     then p_section -> 0 ->> 'text' end),
                    ''::tsvector)
$$;
comment on function sources.section_words(jsonb) is
    'The words of the outermost heading of a chunk''s section trail (sources.chunks.section), '
    'for its lexical vector; none (an empty vector) for null.';
"""

# sources.tg_chunks__inherit as 0086 left it, and with the trail's words.
LEXICAL_0086 = ("    new.lexical := to_tsvector('english'::regconfig, new.text) "
                "|| sources.task_words(new.text);\n")
LEXICAL_0089 = ("    new.lexical := to_tsvector('english'::regconfig, new.text) "
                "|| sources.task_words(new.text) || sources.section_words(new.section);\n")

# Documents with a heading at all (an ATX "#" line or a setext underline): the others' chunks
# stay null.
HEADED = r"body ~ '(^|\n) {0,3}#{1,6}([ \t]|\n|$)' or body ~ '\n {0,3}(=+|-+)[ \t]*(\n|$)'"


def _sees_all() -> bool:
    op.execute("reset role")
    seen = bool(op.get_bind().execute(sa.text(
        "select rolsuper or rolbypassrls from pg_roles where rolname = current_user")).scalar())
    if not seen:
        log.warning("0089: the migrating login cannot see every tenant's chunks (neither a "
                    "superuser nor BYPASSRLS): chunks written before this revision keep no "
                    "section trail until their document's body changes")
    return seen


def _backfill() -> None:
    bind = op.get_bind()
    documents = bind.execute(sa.text(
        f"select tenant_id, id, title from sources.documents where {HEADED}")).all()
    if not documents:
        return
    from orchestrator.markdown import section_trails

    filled = 0
    for tenant_id, document_id, title in documents:
        body = bind.execute(sa.text("select body from sources.documents where tenant_id = :t and id = :d"),
                            {"t": tenant_id, "d": document_id}).scalar_one()
        chunks = bind.execute(sa.text(
            "select id, char_start from sources.chunks where tenant_id = :t and document_id = :d "
            "order by char_start, ordinal"), {"t": tenant_id, "d": document_id}).all()
        trails = section_trails(body, [c.char_start for c in chunks], title)
        rows = [{"t": tenant_id, "i": c.id, "s": json.dumps([{"level": lv, "text": tx} for lv, tx in trail])}
                for c, trail in zip(chunks, trails, strict=True) if trail]
        if rows:
            bind.execute(sa.text("update sources.chunks set section = cast(:s as jsonb) "
                                 "where tenant_id = :t and id = :i"), rows)
            filled += len(rows)
    log.info("0089: %d chunks of %d documents with headings got their section trail",
             filled, len(documents))


def _baseline() -> None:
    # The chain trigger stages events and numbers them at COMMIT; the baseline appends at
    # once. Staged events of this migration run (this backfill's, an earlier revision's in the
    # same run: 0086 updates chunks) are chained first, so the BASELINE is every chunk's
    # latest event.
    op.execute("set constraints provenance.tg_pending_commits__chain immediate")
    op.execute("select provenance.baseline('sources.chunks'::regclass)")
    op.execute("set constraints provenance.tg_pending_commits__chain deferred")


def _patch_inherit(before: str, after: str) -> None:
    """``sources.tg_chunks__inherit`` from the catalog with its lexical line replaced (checked
    to hold it once, so nothing else in the function changes)."""
    bind = op.get_bind()
    definition = bind.execute(sa.text(
        "select pg_get_functiondef('sources.tg_chunks__inherit()'::regprocedure)")).scalar_one()
    if definition.count(before) != 1:
        raise RuntimeError(f"sources.tg_chunks__inherit is not the one revision {revision} patches")
    # Sent as it is: the definition holds RAISE formats ('%') that are not parameters.
    cursor = bind.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(definition.replace(before, after))
    finally:
        cursor.close()


def upgrade() -> None:
    op.execute(UPGRADE_SQL)
    _patch_inherit(LEXICAL_0086, LEXICAL_0089)
    if _sees_all():
        _backfill()
        _baseline()
    op.execute("set role engram_owner")


def downgrade() -> None:
    _patch_inherit(LEXICAL_0089, LEXICAL_0086)
    # The trail's words leave the lexical vectors (the trigger computes them again).
    op.execute("reset role")
    op.execute("update sources.chunks set section = null where section is not null")
    op.execute("set role engram_owner")
    op.execute("alter table sources.chunks drop column section")
    op.execute("drop function sources.section_words(jsonb)")
    if _sees_all():
        _baseline()
    op.execute("set role engram_owner")
