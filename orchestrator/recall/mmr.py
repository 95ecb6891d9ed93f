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

``lambda = 1`` is merit order exactly (the cap still applies); ``diverse`` off
(``recall_diverse``) skips the step.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestrator.recall.tail import Candidate


def _unit(c: Candidate) -> np.ndarray[Any, Any] | None:
    if c.embedding is None:
        return None
    v = np.asarray(c.embedding, dtype=np.float64)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else None


def _mmr_group(group: list[Candidate], lam: float, doc_cap: int,
               taken: dict[uuid.UUID, int]) -> tuple[list[Candidate], list[Candidate]]:
    """(picked in MMR order, deferred by the document cap)."""
    if not group:
        return [], []
    # Merit is already scaled to [0, 1] over the whole pool (plus the pinned boost); scaling
    # it again within a group would make the group's last item worth nothing.
    rel = np.array([c.merit for c in group], dtype=np.float64)
    vecs = [_unit(c) for c in group]
    dim = next((v.shape[0] for v in vecs if v is not None), 0)
    mat = np.zeros((len(group), max(dim, 1)))
    has = np.zeros(len(group), dtype=bool)
    for i, v in enumerate(vecs):
        if v is not None and v.shape[0] == dim:
            mat[i], has[i] = v, True
    max_sim = np.zeros(len(group))  # to anything picked so far
    left = list(range(len(group)))
    picked: list[Candidate] = []
    deferred: list[Candidate] = []
    while left:
        idx = np.array(left)
        score = lam * rel[idx] - (1.0 - lam) * max_sim[idx]
        # Ties keep the incoming (merit, then stable key) order: argmax takes the first.
        j = int(idx[int(np.argmax(score))])
        left.remove(j)
        c = group[j]
        if c.document_id is not None and doc_cap > 0 and taken.get(c.document_id, 0) >= doc_cap:
            deferred.append(c)
            continue
        picked.append(c)
        if c.document_id is not None:
            taken[c.document_id] = taken.get(c.document_id, 0) + 1
        if has[j] and left:
            sims = mat @ mat[j]
            max_sim = np.maximum(max_sim, np.where(has, sims, 0.0))
    return picked, deferred


def diversify(ordered: Sequence[Candidate], lam: float, doc_cap: int
              ) -> tuple[list[Candidate], list[Candidate]]:
    """The MMR order of ``ordered`` (directly named first), and the candidates the document
    cap deferred to the end (they are at the end of the returned order too)."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the MMR lambda must be in [0, 1], not {lam}")
    taken: dict[uuid.UUID, int] = {}
    out: list[Candidate] = []
    deferred: list[Candidate] = []
    for direct in (True, False):
        picked, later = _mmr_group([c for c in ordered if c.direct == direct], lam, doc_cap, taken)
        out += picked
        deferred += later
    return out + deferred, deferred
