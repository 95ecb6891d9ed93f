"""Per-candidate features for the learned ranker: what the statement and the tail already know.

Order of work (``feature_matrix``), one row per candidate, columns in ``FEATURES``
order (``FEATURE_VERSION`` names this exact list; a model trained on another
list is refused, never fed misaligned columns):

1. the lanes' own signals: fused RRF (value, rank in the pool, share of the
   best), the dense rank and distance, the lexical rank and BM25 (and its share
   of the best), the title rank and the direct-subject bit, the timeline rank,
   the best rank among the memory lanes and how many lanes found the item;
2. the query vector against the candidate's embedding (cosine, its rank, its gap
   to the best) and the nearest better-fused candidate (duplicate similarity);
3. the words: how many of the question's content terms the text holds (count and
   share), how many entity seeds it names, whether its author is named in the
   question or is the asker;
4. time: distance to the best fused source candidate (the evidence a timeline
   neighbour neighbours) and age against the newest candidate;
5. what the item is: kind, provenance class, pinned, confidence, length, how
   many candidates share its document, the personalized PageRank score
   (``recall.ppr``), and the cross-encoder's score where one ran.

Missing values are NaN (LightGBM routes them as missing), never a made-up 0.
Everything here is computed from the candidates the caller's RLS let through,
so a feature can carry nothing the caller could not see.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from orchestrator.recall.result import Provenance
from orchestrator.recall.tail import Candidate

FEATURE_VERSION = "f1"
FEATURES: tuple[str, ...] = (
    "rrf", "rrf_rank", "rrf_share", "dense_rank", "dense_distance", "lexical_rank", "bm25",
    "bm25_share", "title_rank", "direct", "timeline_rank", "memory_rank", "lanes",
    "cosine", "cosine_rank", "cosine_gap", "duplicate_similarity",
    "term_hits", "term_share", "seed_mentions", "author_named", "author_is_asker",
    "hours_to_best", "age_days",
    "kind", "provenance", "pinned", "confidence", "log_length", "same_document", "ppr", "rerank",
    "question_terms",
)
# Kinds as numbers (a tree splits on them); unknown kinds share the last code.
KIND_CODES = {"source": 0, "fact": 1, "keyed fact": 2, "summary": 3, "overview": 3,
              "community summary": 4, "session note": 5, "profile": 6, "episode": 7,
              "observation": 8, "decision": 9, "area_catalog": 10, "project_catalog": 10}
PROVENANCE_CODES = {Provenance.SOURCE_EXCERPT: 0, Provenance.DERIVED_MEMORY: 1,
                    Provenance.RECENT_SESSION_MEMORY: 2}
SOURCE_RANK_KEYS = ("dense_rank", "lexical_rank", "title_rank", "timeline_rank")
NAN = float("nan")

_WORD = re.compile(r"[a-z0-9]+")
# Words that carry no evidence of their own: a question's grammar, not its subject.
STOPWORDS = frozenset((
    "a", "about", "above", "after", "again", "against", "all", "am", "an", "and", "any", "are", "as",
    "at", "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can",
    "could", "did", "do", "does", "doing", "down", "during", "each", "few", "for", "from", "further",
    "had", "has", "have", "having", "he", "her", "here", "hers", "herself", "him", "himself", "his",
    "how", "i", "if", "in", "into", "is", "it", "its", "itself", "just", "me", "more", "most", "my",
    "myself", "no", "nor", "not", "now", "of", "off", "on", "once", "only", "or", "other", "our",
    "ours", "ourselves", "out", "over", "own", "same", "she", "should", "so", "some", "such", "than",
    "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these", "they", "this",
    "those", "through", "to", "too", "under", "until", "up", "very", "was", "we", "were", "what",
    "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you", "your",
    "yours", "yourself", "yourselves", "did", "does", "ever", "also", "like", "get", "got", "go",
    "went", "know", "think", "really",
))


def stem(word: str) -> str:
    """A light suffix strip, enough for question words to meet their inflections."""
    for suffix in ("ing", "ies", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


def terms(text: str) -> set[str]:
    """Content terms of a text: lowercase words, stopwords out, lightly stemmed."""
    return {stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS and len(w) > 1}


@dataclass
class RankContext:
    """What one recall knows besides its candidates."""

    question: str
    asker: str | None = None
    query_vector: Any = None
    seeds: Sequence[str] = ()
    ppr: dict[str, float] = field(default_factory=dict)  # candidate key -> PPR score


def _when(c: Candidate) -> datetime | None:
    return c.occurred_at or c.updated_at or c.created_at


def _ranks(values: Sequence[float], descending: bool) -> list[float]:
    """1-based competition ranks (ties share the best rank); NaN stays NaN."""
    present = sorted((v for v in values if not math.isnan(v)), reverse=descending)
    first: dict[float, int] = {}
    for i, v in enumerate(present, 1):
        first.setdefault(v, i)
    return [NAN if math.isnan(v) else float(first[v]) for v in values]


def _unit_rows(candidates: Sequence[Candidate]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(matrix of unit embeddings, mask of rows that have one)."""
    dim = next((len(c.embedding) for c in candidates if c.embedding is not None), 0)
    mat = np.zeros((len(candidates), max(dim, 1)), dtype=np.float32)
    mask = np.zeros(len(candidates), dtype=bool)
    for i, c in enumerate(candidates):
        if c.embedding is not None and len(c.embedding) == dim:
            v = np.asarray(c.embedding, dtype=np.float32)
            n = float(np.linalg.norm(v))
            if n > 0:
                mat[i] = v / n
                mask[i] = True
    return mat, mask


def _name_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    wanted = sorted({n.strip().lower() for n in names if len(n.strip()) >= 3}, key=len, reverse=True)
    if not wanted:
        return None
    return re.compile(r"\b(?:" + "|".join(re.escape(n) for n in wanted) + r")\b")


def feature_matrix(candidates: Sequence[Candidate], ctx: RankContext) -> np.ndarray[Any, Any]:
    """``len(candidates) x len(FEATURES)`` float32, in ``FEATURES`` order."""
    n = len(candidates)
    out = np.full((n, len(FEATURES)), np.nan, dtype=np.float32)
    if n == 0:
        return out
    col = {name: i for i, name in enumerate(FEATURES)}

    def put(name: str, values: Sequence[float] | np.ndarray[Any, Any]) -> None:
        out[:, col[name]] = values

    lanes = [c.lanes for c in candidates]

    def lane(key: str) -> list[float]:
        return [float(x[key]) if x.get(key) is not None else NAN for x in lanes]

    rrf = [c.rrf for c in candidates]
    best_rrf = max(rrf) or 1.0
    put("rrf", rrf)
    put("rrf_rank", _ranks(rrf, descending=True))
    put("rrf_share", [r / best_rrf for r in rrf])
    for key in ("dense_rank", "dense_distance", "lexical_rank", "bm25", "title_rank", "timeline_rank"):
        put(key, lane(key))
    bm25 = lane("bm25")
    best_bm25 = max((b for b in bm25 if not math.isnan(b)), default=0.0) or 1.0
    put("bm25_share", [b / best_bm25 for b in bm25])
    put("direct", [float(c.direct) for c in candidates])
    memory = []
    for x in lanes:
        ranks = [float(v) for k, v in x.items()
                 if k.endswith("_rank") and k not in SOURCE_RANK_KEYS and v is not None]
        memory.append(min(ranks) if ranks else NAN)
    put("memory_rank", memory)
    put("lanes", [float(sum(1 for k in x if k.endswith("_rank"))) for x in lanes])

    # 2. meaning
    mat, mask = _unit_rows(candidates)
    if ctx.query_vector is not None and mask.any():
        q = np.asarray(ctx.query_vector, dtype=np.float32)
        qn = float(np.linalg.norm(q))
        if qn > 0 and q.shape[0] == mat.shape[1]:
            cos = np.where(mask, mat @ (q / qn), np.nan)
            put("cosine", cos)
            put("cosine_rank", _ranks([float(v) for v in cos], descending=True))
            put("cosine_gap", np.nanmax(cos) - cos)
    if mask.sum() > 1:
        gram = mat @ mat.T
        order = np.argsort(-np.asarray(rrf), kind="stable")
        dup = np.full(n, np.nan, dtype=np.float32)
        seen: list[int] = []
        for i in order:
            if mask[i] and seen:
                dup[i] = float(np.max(gram[i, seen]))
            if mask[i]:
                seen.append(int(i))
        put("duplicate_similarity", dup)

    # 3. words
    q_terms = terms(ctx.question)
    seed_re = _name_pattern(ctx.seeds)
    question_lower = ctx.question.lower()
    hits, seeds_named, author_named, author_asker = [], [], [], []
    for c in candidates:
        t_terms = terms(c.text)
        h = len(q_terms & t_terms)
        hits.append(float(h))
        seeds_named.append(float(len(set(seed_re.findall(c.text.lower())))) if seed_re else 0.0)
        author = (c.author or "").strip().lower()
        first = author.split(":")[-1].split()[0] if author else ""
        author_named.append(float(bool(first) and len(first) >= 2
                                  and re.search(r"\b" + re.escape(first) + r"\b", question_lower)
                                  is not None))
        author_asker.append(float(bool(author) and ctx.asker is not None
                                  and author == ctx.asker.strip().lower()))
    put("term_hits", hits)
    put("term_share", [h / len(q_terms) if q_terms else 0.0 for h in hits])
    put("seed_mentions", seeds_named)
    put("author_named", author_named)
    put("author_is_asker", author_asker)
    put("question_terms", [float(len(q_terms))] * n)

    # 4. time
    sources = [c for c in candidates if c.source is not None and _when(c) is not None]
    best = max(sources, key=lambda c: (c.rrf, -len(c.key)), default=None)
    anchor = _when(best) if best is not None else None
    times = [_when(c) for c in candidates]
    newest = max((t for t in times if t is not None), default=None)
    put("hours_to_best", [math.log1p(abs((t - anchor).total_seconds()) / 3600.0)
                          if t is not None and anchor is not None else NAN for t in times])
    put("age_days", [math.log1p(max((newest - t).total_seconds(), 0.0) / 86400.0)
                     if t is not None and newest is not None else NAN for t in times])

    # 5. what the item is
    put("kind", [float(KIND_CODES.get(c.kind, 11)) for c in candidates])
    put("provenance", [float(PROVENANCE_CODES.get(c.provenance, 1)) for c in candidates])
    put("pinned", [float(c.pinned) for c in candidates])
    put("confidence", [NAN if c.confidence is None else float(c.confidence) for c in candidates])
    put("log_length", [math.log1p(len(c.text)) for c in candidates])
    per_doc = Counter(c.document_id for c in candidates if c.document_id is not None)
    put("same_document", [float(per_doc[c.document_id]) if c.document_id is not None else 0.0
                          for c in candidates])
    put("ppr", [ctx.ppr.get(c.key, 0.0) for c in candidates])
    put("rerank", [NAN if c.rerank is None else float(c.rerank) for c in candidates])
    return out
