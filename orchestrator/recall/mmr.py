"""Maximal marginal relevance: the relevance/diversity trade-off, plus a per-document cap.

Order of work (``diversify``), after duplicates are suppressed (``tail.suppress_duplicates``):

1. within each identity group (directly named sources first, then the rest;
   the group order never changes), pick greedily the candidate maximising
   ``lambda * merit - (1 - lambda) * max cosine to those already picked``
   (merit is in [0, 1] over the whole pool, plus the pinned boost); the cosine
   is over the candidates' embeddings (an item without one is never penalised,
   and penalises nothing);
2. the **per-document cap**: once ``doc_cap`` chunks of one document are picked,
   the document's other chunks wait until every other candidate is placed, in
   their MMR order (they are deferred, not dropped, so a generous budget still
   gets them).

Only the first ``recall_mmr_depth`` candidates of each group are re-ordered (the
greedy pass is quadratic; what follows them keeps merit order). ``lambda = 1`` is
merit order exactly (the cap still applies); ``diverse`` off (``recall_diverse``)
skips the step.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import numpy as np

from orchestrator.recall.tail import Candidate, unit_rows


def _mmr_group(group: list[Candidate], lam: float, doc_cap: int,
               taken: dict[uuid.UUID, int]) -> tuple[list[Candidate], list[Candidate]]:
    """(picked in MMR order, deferred by the document cap)."""
    if not group:
        return [], []
    # Merit is already scaled to [0, 1] over the whole pool (plus the pinned boost); scaling
    # it again within a group would make the group's last item worth nothing.
    rel = np.array([c.merit for c in group], dtype=np.float64)
    mat, has = unit_rows(group)
    gram = mat @ mat.T
    max_sim = np.zeros(len(group))  # to anything picked so far
    taken_mask = np.zeros(len(group), dtype=bool)
    picked: list[Candidate] = []
    deferred: list[Candidate] = []
    for _ in range(len(group)):
        score = lam * rel - (1.0 - lam) * max_sim
        score[taken_mask] = -np.inf
        # Ties keep the incoming (merit, then stable key) order: argmax takes the first.
        j = int(np.argmax(score))
        taken_mask[j] = True
        c = group[j]
        if c.document_id is not None and doc_cap > 0 and taken.get(c.document_id, 0) >= doc_cap:
            deferred.append(c)
            continue
        picked.append(c)
        if c.document_id is not None:
            taken[c.document_id] = taken.get(c.document_id, 0) + 1
        if has[j]:
            np.maximum(max_sim, np.where(has, gram[j], 0.0), out=max_sim)
    return picked, deferred


def diversify(ordered: Sequence[Candidate], lam: float, doc_cap: int, depth: int = 60
              ) -> tuple[list[Candidate], list[Candidate]]:
    """The MMR order of ``ordered`` (directly named first), and the candidates the document
    cap deferred (they follow every other candidate). Only the first ``depth`` candidates of
    each group are re-ordered (what a budget can hold); the rest keep merit order after them."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the MMR lambda must be in [0, 1], not {lam}")
    taken: dict[uuid.UUID, int] = {}
    out: list[Candidate] = []
    tail: list[Candidate] = []
    deferred: list[Candidate] = []
    for direct in (True, False):
        group = [c for c in ordered if c.direct == direct]
        picked, later = _mmr_group(group[:depth], lam, doc_cap, taken)
        out += picked
        deferred += later
        tail += group[depth:]
    return out + tail + deferred, deferred
