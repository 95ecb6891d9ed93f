"""What each index tier guarantees, for tests whose assertions depend on the tier.

The suite runs on the tier of the server it is given: the embedded server here (pgvector),
the docker/ image with ``--containers`` (VectorChord). A test that asserts on something a
tier decides asks ``tier_facts`` instead of assuming the portable tier, and says in its
docstring what it checks on each. ``tests/test_index_tiers.py`` checks these facts against
the statement each tier compiles, so they cannot drift from the code.

Since migration 0070 both tiers run the same lexical lane (GIN candidates on
``(tenant_id, lexical)``, BM25 scored over the caller's visible corpus), so its scores and
corpus statistics appear in the trace on both; the tiers differ in the chunks' vector
index: HNSW with iterative scans (pgvector) or vchordrq with prefiltering (VectorChord),
both exact on the tiny corpora tests write (vchordrq has no partition below
``orchestrator.db.indexes.FLAT_BELOW_ROWS`` vectors).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text


@dataclass(frozen=True)
class TierFacts:
    name: str
    # The chunks' vector index method.
    dense_index: str
    # The lexical lane gives each chunk its BM25 score (trace: ``bm25``).
    lexical_scores: bool
    # The statement returns the ``lexical_stats`` row (N, average length) the trace shows.
    lexical_stats: bool
    # The lexical lane's statistics count the caller's visible rows only (never another
    # tenant's or scope's): what a trace may show.
    lexical_stats_visible_only: bool
    # A small tenant's lexical candidates come from its own rows first (no global top-k
    # that a large tenant can fill before the tenant filter applies).
    lexical_tenant_first: bool


TIERS = {
    "pgvector": TierFacts("pgvector", "hnsw", lexical_scores=True, lexical_stats=True,
                          lexical_stats_visible_only=True, lexical_tenant_first=True),
    "vectorchord": TierFacts("vectorchord", "vchordrq", lexical_scores=True, lexical_stats=True,
                             lexical_stats_visible_only=True, lexical_tenant_first=True),
}


def tier_facts(engine: Engine) -> TierFacts:
    """The facts of the tier the database behind ``engine`` was migrated to."""
    with engine.connect() as conn:
        tier = conn.execute(text(
            "select value from engram.installation where key = 'index_tier'")).scalar()
    return TIERS[str(tier or "pgvector")]
