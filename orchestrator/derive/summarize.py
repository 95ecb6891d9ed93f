"""Extractive summaries: centroid-anchored MMR sentence selection, no language model.

Sentences are TF-IDF vectors over the evidence itself. The first pick is the
sentence closest to the centroid (what the evidence is mostly about); each next
pick maximises ``λ·sim(s, centroid) − (1−λ)·max sim(s, picked)`` so the summary
covers several aspects instead of repeating one. Deterministic: ties break on
the sentence text, so an unchanged input always yields the same summary.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

METHOD = "extractive:centroid-mmr"
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def _vectors(sentences: Sequence[str]) -> list[dict[str, float]]:
    bags = [Counter(w.lower() for w in _WORD.findall(s)) for s in sentences]
    df = Counter(w for bag in bags for w in bag)
    n = len(sentences)
    out = []
    for bag in bags:
        vec = {w: (1 + math.log(c)) * math.log((1 + n) / (1 + df[w]) + 1) for w, c in bag.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        out.append({w: v / norm for w, v in vec.items()})
    return out


def _cos(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(w, 0.0) for w, v in a.items())


def summarize(sentences: Sequence[str], *, max_sentences: int = 3, max_chars: int = 2000,
              diversity: float = 0.3) -> str:
    """Pick up to ``max_sentences`` representative, mutually different sentences."""
    unique = sorted({s.strip() for s in sentences if s and s.strip()})
    if not unique:
        return ""
    vecs = _vectors(unique)
    centroid: dict[str, float] = {}
    for vec in vecs:
        for w, v in vec.items():
            centroid[w] = centroid.get(w, 0.0) + v / len(vecs)
    relevance = [_cos(v, centroid) for v in vecs]
    picked: list[int] = []
    while len(picked) < min(max_sentences, len(unique)):
        def score(i: int) -> tuple[float, int]:
            redundancy = max((_cos(vecs[i], vecs[j]) for j in picked), default=0.0)
            # Rounded so float noise never decides; then the alphabetically first wins.
            return round((1 - diversity) * relevance[i] - diversity * redundancy, 9), -i
        picked.append(max((i for i in range(len(unique)) if i not in picked), key=score))
    text = " ".join(unique[i] for i in picked)
    return text[:max_chars]
