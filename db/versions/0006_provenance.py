"""Provenance: the per-tenant hash chain, PROV-O lineage and recall receipts.

Why: reserved in the revision chain so that work on each domain can land in
order; this revision is a no-op until its domain fills it.

Revision ID: 0006_provenance
Revises: 0005_derived_memory
"""

from __future__ import annotations

revision = "0006_provenance"
down_revision = "0005_derived_memory"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
