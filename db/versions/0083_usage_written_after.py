"""Feedback labels an event that was written moments after the recall it records.

Why: a recall's usage rows (``memory.rank_events`` and the served rows of
``memory.usage_ledger``) were written in the recall's own transaction. Both tables are
chained, so every recall staged about ten chain events and appended them at COMMIT under
its tenant's chain lock: 3.5-5 ms of the recall's INSERT and 0.5 ms more at COMMIT on the
kept 10k benchmark corpus, on the path of every recall, for bookkeeping that is not
evidence. The recall now queues them and the process's background writer
(``orchestrator.recall.access.UsageRows``) writes them moments later, one transaction per
reader for a burst of recalls.

An event's ``occurred_at`` is therefore its write, a moment after the recall, and feedback
sent right after the recall (an agent's ``markUsed``, a script) can be stamped before the
event it is for. ``rank_training_rows`` labelled an item used only when its ``mark_used``
came at or after ``occurred_at``; it now also counts one sent up to ``LEEWAY`` before it.
Feedback more than that before an event is still not a label for it. The process that
queued the event writes its queue before recording feedback (``mark_evidence_used``), so
within one process the gap is milliseconds; the leeway covers feedback sent to another
process of the same deployment.

What changes: ``memory.rank_training_rows`` as 0050 wrote it, with its label condition's
lower bound moved back by ``LEEWAY``. Everything else (signature, security, grants, what it
returns) is unchanged.

Revision ID: 0083_usage_written_after
Revises: 0082_receipt_seal_static
"""

from __future__ import annotations

from alembic import context, op

revision = "0083_usage_written_after"
down_revision = "0082_receipt_seal_static"
branch_labels = None
depends_on = None

LEEWAY = "10 seconds"
_LOWER = "and l.occurred_at >= e.occurred_at and l.occurred_at < e.occurred_at + p_window"
_LOWER_NOW = (f"and l.occurred_at >= e.occurred_at - interval '{LEEWAY}' "
              "and l.occurred_at < e.occurred_at + p_window")


def _released() -> str:
    """0050's ``rank_training_rows`` as released (0050 is pinned by db/released.sha256):
    the function and its comment, as ``create or replace``."""
    script = context.script.get_revision("0050_rank_learning")
    assert script is not None
    sql: str = script.module.SQL
    start = sql.index("create function memory.rank_training_rows")
    end = sql.index("revoke all on function memory.rank_training_rows")
    return sql[start:end].replace("create function", "create or replace function", 1)


def _with_leeway() -> str:
    text = _released()
    if text.count(_LOWER) != 1:
        raise RuntimeError("0050's rank_training_rows does not hold its label condition once")
    return text.replace(_LOWER, _LOWER_NOW).replace(
        "within p_window.", f"within p_window (from {LEEWAY} before the event: it is written "
                            "moments after its recall).", 1)


def upgrade() -> None:
    op.execute(_with_leeway())


def downgrade() -> None:
    op.execute(_released())
