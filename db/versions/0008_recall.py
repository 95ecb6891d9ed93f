"""Recall support: lexical term statistics and indexes the recall statement needs.

Why: reserved in the revision chain so that work on each domain can land in
order; this revision is a no-op until its domain fills it.

Revision ID: 0008_recall
Revises: 0007_embedding_models
"""

from __future__ import annotations

revision = "0008_recall"
down_revision = "0007_embedding_models"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
