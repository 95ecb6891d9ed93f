"""Task list items are found by the words people ask for them with.

Why: notes keep their to-dos as Markdown task lists (GitHub's and Obsidian's ``- [ ] Renew
the contract``, ``- [x] Security sign-off``). "What are my open tasks?" found none of them
over an Obsidian-style vault: the checkbox is punctuation to the text search parser, and
the items themselves rarely say "task". The lexical lane never saw them, and the meaning
of "open tasks" is not the meaning of "Renew Grafana Cloud before Jan 15".

What changes: ``sources.task_words(text)`` gives the words a chunk's task items stand for:
for an open item (``[ ]`` after a list marker at the start of a line: ``-``, ``*``, ``+``
or ``1.``/``1)``) "open", "task", "todo", "to-do" and "pending"; for a done one (``[x]``)
"done", "task", "completed" and "finished", analysed as the chunk's text is (``english``).
``sources.tg_chunks__inherit`` adds them to the chunk's lexical vector (its text, hash and
everything else as before), so BM25 finds and scores them like the chunk's own words
(they count in its length). Chunks written before this revision that hold task items get
them here (one update of those rows; the migrating superuser sees every tenant's).
``orchestrator.recall.features.task_words`` is the same rule for the learned ranker's
term features.

Revision ID: 0086_task_words
Revises: 0085_receipt_seal_names
"""

from __future__ import annotations

import logging

import sqlalchemy as sa
from alembic import context, op

revision = "0086_task_words"
down_revision = "0085_receipt_seal_names"
branch_labels = None
depends_on = None
log = logging.getLogger("alembic.runtime.migration")

# A list item's checkbox at the start of a line (newline-sensitive: ^ after each newline).
OPEN_ITEM = r"(?n)^[ \t]*([-*+]|[0-9]+[.)])[ \t]+\[ \]"
DONE_ITEM = r"(?n)^[ \t]*([-*+]|[0-9]+[.)])[ \t]+\[[xX]\]"
OPEN_WORDS = "open task todo to-do pending"
DONE_WORDS = "done task completed finished"

TASK_WORDS = f"""
create function sources.task_words(p_text text) returns tsvector
    language sql immutable parallel safe strict
    set search_path = pg_catalog, pg_temp
as $$
    -- No bracket, no task item: most chunks pay one scan for a byte, not two regexes.
    select case when strpos(p_text, '[') = 0 then ''::tsvector
                else case when p_text ~ '{OPEN_ITEM}'
                          then to_tsvector('english'::regconfig, '{OPEN_WORDS}') else ''::tsvector end
                  || case when p_text ~ '{DONE_ITEM}'
                          then to_tsvector('english'::regconfig, '{DONE_WORDS}') else ''::tsvector end
           end
$$;
comment on function sources.task_words(text) is
    'The words a text''s Markdown task items stand for (open: open task todo to-do pending; '
    'done: done task completed finished), for the chunk''s lexical vector.';
"""

LEXICAL = "    new.lexical := to_tsvector('english'::regconfig, new.text);\n"
WITH_TASK_WORDS = ("    new.lexical := to_tsvector('english'::regconfig, new.text) "
                   "|| sources.task_words(new.text);\n")


def _released_inherit() -> str:
    """``sources.tg_chunks__inherit`` as 0002 wrote it (pinned by db/released.sha256, so it
    cannot change under this patch), as ``create or replace``."""
    script = context.script.get_revision("0002_sources")
    assert script is not None
    sql: str = script.module.TRIGGERS_SQL
    head = "create function sources.tg_chunks__inherit() returns trigger"
    start = sql.index(head)
    body = sql[start:sql.index("\n$$;\n", start) + len("\n$$;\n")]
    if body.count(LEXICAL) != 1:
        raise RuntimeError("0002's sources.tg_chunks__inherit does not set the lexical vector once")
    return body.replace("create function", "create or replace function", 1)


def inherit(with_task_words: bool) -> str:
    """The chunk trigger function, its lexical vector with or without the task words."""
    body = _released_inherit()
    return body.replace(LEXICAL, WITH_TASK_WORDS) if with_task_words else body


# The trigger computes the vector again from the text; the text, its hash and its embedding
# do not change.
RECOMPUTE = (f"update sources.chunks set lexical = lexical where strpos(text, '[') > 0 "
             f"and (text ~ '{OPEN_ITEM}' or text ~ '{DONE_ITEM}')")


def _recompute() -> None:
    """As the migrating login (a superuser): under the chunks' forced RLS the owner, with no
    identity bound, sees none of them (as 0041). A login that neither is a superuser nor
    bypasses RLS would update nothing, and says so."""
    op.execute("reset role")
    sees_all = op.get_bind().execute(sa.text(
        "select rolsuper or rolbypassrls from pg_roles where rolname = current_user")).scalar()
    if not sees_all:
        log.warning("0086: the migrating login %s cannot see every tenant's chunks (neither a "
                    "superuser nor BYPASSRLS): chunks written before this revision keep their "
                    "lexical vectors without task words until their text changes",
                    op.get_bind().execute(sa.text("select current_user")).scalar())
    op.execute(RECOMPUTE)
    op.execute("set role engram_owner")


def upgrade() -> None:
    op.execute(TASK_WORDS)
    op.execute(inherit(True))
    _recompute()


def downgrade() -> None:
    op.execute(inherit(False))
    _recompute()
    op.execute("drop function sources.task_words(text)")
