"""Knowledge model: entities, fact content and claims, keyed facts, shapes, quarantine, conflicts.

Why: reserved in the revision chain so that work on each domain can land in
order; this revision is a no-op until its domain fills it.

Revision ID: 0004_knowledge
Revises: 0003_index_tier
"""

from __future__ import annotations

revision = "0004_knowledge"
down_revision = "0003_index_tier"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
