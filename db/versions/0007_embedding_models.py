"""Embedding model registry and the embedding queue's bookkeeping.

Why: reserved in the revision chain so that work on each domain can land in
order; this revision is a no-op until its domain fills it.

Revision ID: 0007_embedding_models
Revises: 0006_provenance
"""

from __future__ import annotations

revision = "0007_embedding_models"
down_revision = "0006_provenance"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
