"""Derived-memory tables: working memory, profiles, episodes, observations, decisions, communities, RAPTOR, usage.

Why: reserved in the revision chain so that work on each domain can land in
order; this revision is a no-op until its domain fills it.

Revision ID: 0005_derived_memory
Revises: 0004_knowledge
"""

from __future__ import annotations

revision = "0005_derived_memory"
down_revision = "0004_knowledge"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
