"""The rerank tail: the cross-encoder sees full chunks when present; the trace says when it is not.

No cross-encoder ships in a package, so the available path uses the worker tests'
tiny randomly initialised cross-encoder: its scores mean nothing, but they are
real model outputs, and the tail must order by them inside each identity group.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from orchestrator.config import Settings
from orchestrator.recall import Recaller
from tests.support.recall import doc, embedder, write_documents
from tests.support.worker import build_tiny_cross_encoder

__all__ = ["embedder"]

LONG = ("Opening notes about the kitchen renovation. " * 20
        + "Risks: the electrician may be late. Next actions: order tiles.")


class Recording:
    """The real reranker, remembering what it was asked to score."""

    def __init__(self, inner):
        self.inner = inner
        self.passages: list[str] = []
        self.model_name = inner.model_name

    @property
    def available(self) -> bool:
        return self.inner.available

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        self.passages = list(passages)
        return self.inner.score(query, passages)


@pytest.fixture
def corpus(tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    write_documents(app_engine, ident, embedder, [
        doc("kitchen.md", "Kitchen renovation", LONG),
        doc("bath.md", "Bathroom", "The bathroom tiles were ordered last week."),
        doc("hall.md", "Hallway", "Paint the hallway in spring."),
    ], settings)
    return ident


def test_unavailable_reranker_leaves_the_order_to_the_learned_ranker_and_says_so(
        corpus, app_engine, settings, embedder):
    from orchestrator.worker.embedder import Reranker

    absent = Reranker.from_settings(Settings(reranker_model="nobody/absent-reranker"))
    assert not absent.available
    recaller = Recaller(app_engine, settings, embedder=embedder, reranker=absent)
    _, trace = recaller.trace(corpus, "what are the risks of the kitchen renovation?")
    assert trace.reranker.startswith("unavailable")
    assert trace.ranker.startswith("default ") and "scored" in trace.ranker
    assert all(it.rerank is None for it in trace.ordered)
    groups = [not it.direct for it in trace.ordered]
    assert groups == sorted(groups), "direct subjects come first"


def test_available_reranker_scores_full_chunks_and_orders_each_group(
        corpus, app_engine, settings, embedder, tmp_path):
    from orchestrator.worker.embedder import Reranker

    tiny = build_tiny_cross_encoder(tmp_path / "ce")
    inner = Reranker.from_settings(Settings(reranker_model="tests/tiny", reranker_model_path=tiny,
                                            rerank_batch_size=4,
                                            reranker_window_overlap_tokens=16))
    assert inner.available
    rec = Recording(inner)
    recaller = Recaller(app_engine, settings, embedder=embedder, reranker=rec)
    result, trace = recaller.trace(corpus, "what are the risks of the kitchen renovation?")
    assert "scored" in trace.reranker
    assert len(LONG) < settings.chunk_size_chars
    assert LONG in rec.passages, "the reranker sees the complete chunk, late sections included"
    sources = [it for it in trace.ordered if it.kind == "source"]
    assert all(it.rerank is not None for it in sources)
    for direct in (True, False):
        merits = [it.merit for it in trace.ordered if it.direct is direct]
        assert merits == sorted(merits, reverse=True)
    assert result.evidence[0].source.title == "Kitchen renovation"
