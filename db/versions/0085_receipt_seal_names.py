"""A receipt's seal names each table from the catalog cache, not by a query per table.

Why: the seal trigger (``tg_receipts__seal``, 0040 as 0082 left it) writes each evidence
item's table under its canonical name (``schema.table``) with ``provenance.table_name``, a
SQL function with a ``SET`` clause: PostgreSQL cannot inline it, and each call plans and
runs a join of ``pg_class`` and ``pg_namespace``. A recall's receipt names up to eleven
tables; on the kept 10k corpus's 10-chunk tenant (27 served rows from 9 tables) the
receipt's INSERT took 4.7-5.0 ms, and 3.7-4.3 ms with the names taken as written
(benchmarks' scratch measurement, three rounds each).

What changes: the name is the ``regclass``'s own text when that text is ``schema.table``
with neither part quoted, which is exactly what ``table_name`` returns for it (the
trigger's search path is ``pg_catalog, pg_temp``, so a table of any other schema prints
qualified; an identifier prints unquoted only when it is written as it is stored).
Any other name (quoted, or unqualified) still goes through ``table_name``. The sealed
receipt is the same bytes; everything the seal refuses, and every message, is as before.

Revision ID: 0085_receipt_seal_names
Revises: 0084_fair_embed_queue
"""

from __future__ import annotations

from alembic import context, op

revision = "0085_receipt_seal_names"
down_revision = "0084_fair_embed_queue"
branch_labels = None
depends_on = None

# Each anchor must occur once in 0082's seal.
PATCHES = (
    ("""    v_name text;
""",
     """    v_name text;
    v_text text;
"""),
    ("""        v_canonical := v_canonical || jsonb_build_object(v_name, provenance.table_name(v_table));
""",
     """        v_text := v_table::text;  -- the catalog cache's name: schema.table unless quoted
        v_canonical := v_canonical || jsonb_build_object(v_name, case
            when strpos(v_text, '.') > 0 and strpos(v_text, '"') = 0 then v_text
            else provenance.table_name(v_table) end);
"""),
)


def _released_seal() -> str:
    """The seal as 0082 wrote it (0082 is pinned by db/released.sha256)."""
    script = context.script.get_revision("0082_receipt_seal_static")
    assert script is not None
    seal_sql: str = script.module.seal()
    return seal_sql


def seal() -> str:
    text = _released_seal()
    for old, new in PATCHES:
        if text.count(old) != 1:
            raise RuntimeError(f"0082's seal trigger does not hold this line once: {old[:80]!r}")
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    op.execute(seal())


def downgrade() -> None:
    op.execute(_released_seal())
