"""Maximal marginal relevance: the relevance/diversity trade-off, plus a per-document cap.

Order of work (``diversify``), after duplicates are suppressed (``tail.suppress_duplicates``):

1. within each identity group (directly named sources first, then the rest;
   the group order never changes), pick greedily the candidate maximising
   ``lambda * merit - (1 - lambda) * max cosine to those already picked``
   (merit is in [0, 1] over the whole pool, plus the pinned boost); the cosine
   is over the candidates' embeddings (an item without one is never penalised,
   and penalises nothing);
2. the **per-document cap**: once ``doc_cap`` chunks of one document are picked,
   each further chunk of it competes again with its merit times ``cap_discount``
   (0.5 by default): it waits for the other documents' comparable evidence, not
   for everything (with ``cap_discount`` 0 it waits behind every candidate with
   any merit: a chunk of merit 0.7 once followed facts of merit 0.03). Deferred,
   never dropped.

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


def _mmr_group(group: list[Candidate], lam: float, doc_cap: int, taken: dict[uuid.UUID, int],
               cap_discount: float) -> tuple[list[Candidate], list[Candidate]]:
    """(the group in MMR order, the chunks the document cap deferred: placed later than their
    merit alone would have put them)."""
    if not group:
        return [], []
    # Merit is already scaled to [0, 1] over the whole pool (plus the pinned boost); scaling
    # it again within a group would make the group's last item worth nothing.
    rel = np.array([c.merit for c in group], dtype=np.float64)
    mat, has = unit_rows(group)
    gram = mat @ mat.T
    max_sim = np.zeros(len(group))  # to anything picked so far
    taken_mask = np.zeros(len(group), dtype=bool)
    discounted = np.zeros(len(group), dtype=bool)
    picked: list[Candidate] = []
    deferred: list[Candidate] = []
    while len(picked) < len(group):
        score = lam * rel - (1.0 - lam) * max_sim
        score[taken_mask] = -np.inf
        # Ties keep the incoming (merit, then stable key) order: argmax takes the first.
        j = int(np.argmax(score))
        c = group[j]
        if (not discounted[j] and c.document_id is not None and doc_cap > 0
                and taken.get(c.document_id, 0) >= doc_cap):
            # Past its document's cap: compete again, discounted (once).
            discounted[j] = True
            rel[j] *= cap_discount
            deferred.append(c)
            continue
        taken_mask[j] = True
        picked.append(c)
        if c.document_id is not None:
            taken[c.document_id] = taken.get(c.document_id, 0) + 1
        if has[j]:
            np.maximum(max_sim, np.where(has, gram[j], 0.0), out=max_sim)
    return picked, deferred


def diversify(ordered: Sequence[Candidate], lam: float, doc_cap: int, depth: int = 60,
              cap_discount: float = 0.5) -> tuple[list[Candidate], list[Candidate]]:
    """The MMR order of ``ordered`` (directly named first), and the chunks the document cap
    deferred (they compete at ``cap_discount`` times their merit). Only the first ``depth``
    candidates of each group are re-ordered (what a budget can hold); the rest keep merit
    order after them."""
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"the MMR lambda must be in [0, 1], not {lam}")
    if not 0.0 <= cap_discount <= 1.0:
        raise ValueError(f"the document cap's discount must be in [0, 1], not {cap_discount}")
    taken: dict[uuid.UUID, int] = {}
    out: list[Candidate] = []
    tail: list[Candidate] = []
    deferred: list[Candidate] = []
    for direct in (True, False):
        group = [c for c in ordered if c.direct == direct]
        picked, later = _mmr_group(group[:depth], lam, doc_cap, taken, cap_discount)
        out += picked
        deferred += later
        tail += group[depth:]
    return out + tail, deferred
