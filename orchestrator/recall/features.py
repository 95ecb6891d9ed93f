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
3. the words: how many of the question's content terms the text holds (count,
   share, and share weighted by each term's rarity in the pool), how many entity
   seeds it names, whether its author is named in the question or is the asker;
   what the question asks for (``question_type``) and what the text holds
   (``mentions``: time words, numbers, names), so "when" can meet a date;
4. time: distance to the best fused source candidate (the evidence a timeline
   neighbour neighbours), age against the newest candidate, and context: how many
   candidates happened within ``NEAR_SECONDS`` of it and the best of them;
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
from functools import lru_cache
from typing import Any

import numpy as np

from orchestrator.recall.result import Provenance
from orchestrator.recall.tail import Candidate, unit_rows

FEATURE_VERSION = "f2"
FEATURES: tuple[str, ...] = (
    "rrf", "rrf_rank", "rrf_share", "dense_rank", "dense_distance", "lexical_rank", "bm25",
    "bm25_share", "title_rank", "direct", "timeline_rank", "memory_rank", "lanes",
    "cosine", "cosine_rank", "cosine_gap", "duplicate_similarity",
    "term_hits", "term_share", "seed_mentions", "author_named", "author_is_asker",
    "hours_to_best", "age_days",
    "kind", "provenance", "pinned", "confidence", "log_length", "same_document", "ppr", "rerank",
    "question_terms",
    "term_weight_share", "near_count", "near_best_cosine", "near_best_rrf_share",
    "question_type", "time_mentions", "number_mentions", "name_mentions",
)
# Kinds as numbers (a tree splits on them); unknown kinds share the last code.
KIND_CODES = {"source": 0, "fact": 1, "keyed fact": 2, "summary": 3, "overview": 3,
              "community summary": 4, "session note": 5, "profile": 6, "episode": 7,
              "observation": 8, "decision": 9, "area_catalog": 10, "project_catalog": 10}
PROVENANCE_CODES = {Provenance.SOURCE_EXCERPT: 0, Provenance.DERIVED_MEMORY: 1,
                    Provenance.RECENT_SESSION_MEMORY: 2}
SOURCE_RANK_KEYS = ("dense_rank", "lexical_rank", "title_rank", "timeline_rank")
# The lanes' values that are features as they are.
LANE_VALUES = ("dense_rank", "dense_distance", "lexical_rank", "bm25", "title_rank", "timeline_rank")
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


# What a question asks for (its first question word), as a number a tree can split on.
QUESTION_TYPES = {"when": 1, "who": 2, "whom": 2, "whose": 2, "where": 3, "what": 4, "which": 4,
                  "how": 5, "why": 6}
_QUESTION_WORD = re.compile(r"\b(when|who|whom|whose|where|what|which|how|why)\b")
_HOW_MUCH = re.compile(r"\bhow (many|much|long|often|old)\b")
# Words that say when (months, weekdays, relative days), and "last/next/this/past <unit>".
_TIME_WORDS = frozenset((
    "january", "february", "march", "april", "may", "june", "july", "august", "september",
    "october", "november", "december", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep",
    "sept", "oct", "nov", "dec", "monday", "tuesday", "wednesday", "thursday", "friday",
    "saturday", "sunday", "weekend", "yesterday", "today", "tonight", "tomorrow", "ago",
    "recently"))
_TIME_LEADS = frozenset(("last", "next", "this", "past"))
_TIME_UNITS = frozenset(("week", "month", "year", "night", "time", "summer", "winter", "spring",
                         "fall"))
_TIME_PHRASE = re.compile(r"\b(?:last|next|this|past) (?:week|month|year|night|time|summer"
                          r"|winter|spring|fall)\b")
_NUMBER_WORDS = frozenset((
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
    "twelve", "twenty", "thirty", "hundred", "thousand", "million", "dozen", "once", "twice"))
# Capitalised words, less those that open a sentence: names, roughly. (Two plain patterns:
# a word boundary or a look-behind at every position cost five times as much.)
_CAPITALISED = re.compile(r"[A-Z][a-z]+")
_SENTENCE_OPENING = re.compile(r"[.!?]\s+[A-Z][a-z]")
# Candidates that happened this close in time to one another (``occurred_at``) are each other's
# context: a conversation's neighbouring turns, one dated document's chunks.
NEAR_SECONDS = 600.0


def question_type(question: str) -> float:
    """1 when, 2 who, 3 where, 4 what/which, 5 how, 6 why, 7 how many/much/long/often/old,
    0 none (a yes/no question or a statement)."""
    lower = question.lower()
    if _HOW_MUCH.search(lower):
        return 7.0
    m = _QUESTION_WORD.search(lower)
    return float(QUESTION_TYPES[m.group(1)]) if m else 0.0


@lru_cache(maxsize=16384)
def mentions(text: str) -> tuple[float, float, float]:
    """How many distinct time words (and years, and "last week"-like phrases), distinct
    numbers and capitalised names (words inside a sentence) a text holds. Set work over the
    text's words (``words_of``, cached): a regular expression per kind cost ~80 us a text."""
    lower, words = words_of(text)
    digits = list(filter(str.isdigit, words))
    years = sum(1 for w in digits if len(w) == 4 and w[:2] in ("19", "20"))
    time = len(words & _TIME_WORDS) + years
    if words & _TIME_LEADS and words & _TIME_UNITS:
        time += len(_TIME_PHRASE.findall(lower))
    numbers = len(digits) + len(words & _NUMBER_WORDS)
    opening = 1 if text[:1].isupper() and text[1:2].islower() else 0
    names = len(_CAPITALISED.findall(text)) - len(_SENTENCE_OPENING.findall(text)) - opening
    return float(time), float(numbers), float(max(names, 0))


# Stopwords and single characters are never terms.
_NOT_TERMS = STOPWORDS | frozenset("abcdefghijklmnopqrstuvwxyz0123456789")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """A light suffix strip, enough for question words to meet their inflections."""
    for suffix in ("ing", "ies", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return word


# Markdown task items (``- [ ] ...`` open, ``- [x] ...`` done) and the words they stand for:
# the rule of ``sources.task_words`` (migration 0086), which puts the same words into a
# chunk's lexical vector, so "what are my open tasks?" meets its task list here too.
_OPEN_ITEM = re.compile(r"^[ \t]*(?:[-*+]|[0-9]+[.)])[ \t]+\[ \]", re.MULTILINE)
_DONE_ITEM = re.compile(r"^[ \t]*(?:[-*+]|[0-9]+[.)])[ \t]+\[[xX]\]", re.MULTILINE)
OPEN_TASK_WORDS = ("open", "task", "todo", "to-do", "pending")
DONE_TASK_WORDS = ("done", "task", "completed", "finished")


def task_words(text: str) -> tuple[str, ...]:
    """The words ``text``'s task items stand for (none when it holds no task list)."""
    if "[" not in text:
        return ()
    return ((OPEN_TASK_WORDS if _OPEN_ITEM.search(text) else ())
            + (DONE_TASK_WORDS if _DONE_ITEM.search(text) else ()))


@lru_cache(maxsize=16384)
def terms(text: str) -> frozenset[str]:
    """Content terms of a text: lowercase words, stopwords out, lightly stemmed; a task
    list's items add the words they stand for (``task_words``)."""
    words = words_of(text)[1]
    extra = task_words(text)
    if extra:
        words = words | {w for x in extra for w in _WORD.findall(x)}
    return frozenset(map(stem, words - _NOT_TERMS))


@lru_cache(maxsize=4096)
def _first_name(author: str) -> str:
    """"user:ada@x.org" and "Ada Lovelace" both name "ada"."""
    return re.split(r"[\s:@]+", author.split(":", 1)[-1])[0] if author else ""


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


def _ranks(values: Sequence[float] | np.ndarray[Any, Any], descending: bool) -> np.ndarray[Any, Any]:
    """1-based competition ranks (ties share the best rank); NaN stays NaN."""
    v = np.asarray(values, dtype=np.float64)
    present = np.sort(v[~np.isnan(v)])
    if descending:
        # 1 + how many are strictly greater
        ranks = 1.0 + len(present) - np.searchsorted(present, v, side="right")
    else:
        ranks = 1.0 + np.searchsorted(present, v, side="left")
    return np.where(np.isnan(v), np.nan, ranks)


@lru_cache(maxsize=16384)
def words_of(text: str) -> tuple[str, frozenset[str]]:
    """(the text in lower case, its set of words): what ``names_in`` looks names up in."""
    lower = text.lower()
    return lower, frozenset(_WORD.findall(lower))


# first word -> the names that start with it: (name, its words, a pattern for several words)
Names = dict[str, list[tuple[str, tuple[str, ...], "re.Pattern[str] | None"]]]


def prepare_names(names: Iterable[str]) -> Names:
    """``names`` (3+ characters, lower case) indexed by their first word for ``names_in``."""
    out: Names = {}
    for name in names:
        parts = tuple(_WORD.findall(name))
        if len(name) >= 3 and parts:
            out.setdefault(parts[0], []).append((name, parts, _phrase(name) if len(parts) > 1 else None))
    return out


@lru_cache(maxsize=4096)
def _phrase(name: str) -> re.Pattern[str]:
    return re.compile(r"\b" + re.escape(name) + r"\b")


def names_in(text: str, names: Names) -> set[str]:
    """Which of the prepared ``names`` the text names as whole words. Only names whose first
    word is a word of the text are looked at (one set intersection), and a name of several
    words is searched for only when all its words are there."""
    lower, words = words_of(text)
    found: set[str] = set()
    for first in words.intersection(names):
        for name, parts, phrase in names[first]:
            if phrase is None or (words.issuperset(parts) and phrase.search(lower)):
                found.add(name)
    return found


def _near(out: np.ndarray[Any, Any], col: dict[str, int], times: Sequence[datetime | None],
          rrf: Sequence[float], best_rrf: float) -> None:
    """Context in time: how many other candidates happened within ``NEAR_SECONDS`` of each one,
    and the best query cosine and fused share among them (NaN when none or no time)."""
    stamps = np.asarray([t.timestamp() if t is not None else np.nan for t in times], dtype=np.float64)
    known = ~np.isnan(stamps)
    if known.sum() < 2:
        out[:, col["near_count"]] = np.where(known, 0.0, np.nan)
        return
    near = np.abs(stamps[:, None] - stamps[None, :]) <= NEAR_SECONDS
    near[~known, :] = False
    near[:, ~known] = False
    np.fill_diagonal(near, False)
    count = near.sum(axis=1).astype(np.float32)
    out[:, col["near_count"]] = np.where(known, count, np.nan)
    has = count > 0
    share = np.asarray(rrf, dtype=np.float64) / (best_rrf or 1.0)
    out[:, col["near_best_rrf_share"]] = np.where(
        has, np.where(near, share[None, :], -np.inf).max(axis=1), np.nan)
    cos = out[:, col["cosine"]].astype(np.float64)
    if not np.isnan(cos).all():
        best = np.where(near & ~np.isnan(cos)[None, :], cos[None, :], -np.inf).max(axis=1)
        out[:, col["near_best_cosine"]] = np.where(np.isfinite(best), best, np.nan)


@lru_cache(maxsize=8)
def _upper_triangle(n: int) -> np.ndarray[Any, Any]:
    """The diagonal and above of an n x n matrix, as a mask (read-only: shared by recalls)."""
    mask = np.triu(np.ones((n, n), dtype=bool))
    mask.flags.writeable = False
    return mask


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
    rrf = [c.rrf for c in candidates]
    best_rrf = max(rrf) or 1.0
    put("rrf", rrf)
    put("rrf_rank", _ranks(rrf, descending=True))
    put("rrf_share", [r / best_rrf for r in rrf])
    # One pass over the lanes' dicts: each lane's own values, then the best memory-lane rank
    # and how many lanes found the item (a dict per candidate; a pass per column cost 4x).
    table = []
    for x in lanes:
        memory, found = NAN, 0
        for k, v in x.items():
            if k.endswith("_rank"):
                found += 1
                if v is not None and k not in SOURCE_RANK_KEYS:
                    r = float(v)
                    if not memory <= r:  # the smallest; NaN (none yet) loses to any rank
                        memory = r
        table.append([NAN if x.get(k) is None else float(x[k]) for k in LANE_VALUES]
                     + [memory, float(found)])
    values = np.asarray(table, dtype=np.float64)
    out[:, [col[k] for k in (*LANE_VALUES, "memory_rank", "lanes")]] = values
    bm25 = values[:, LANE_VALUES.index("bm25")]
    best_bm25 = float(np.nanmax(bm25)) if not np.isnan(bm25).all() else 0.0
    put("bm25_share", bm25 / (best_bm25 or 1.0))
    put("direct", [float(c.direct) for c in candidates])

    # 2. meaning
    mat, mask = unit_rows(candidates)
    if ctx.query_vector is not None and mask.any():
        q = np.asarray(ctx.query_vector, dtype=np.float32)
        qn = float(np.linalg.norm(q))
        if qn > 0 and q.shape[0] == mat.shape[1]:
            cos = np.where(mask, mat @ (q / qn), np.nan)
            put("cosine", cos)
            put("cosine_rank", _ranks(cos, descending=True))
            put("cosine_gap", np.nanmax(cos) - cos)
    if mask.sum() > 1:
        # For each candidate, its highest cosine to any candidate fused above it.
        order = np.argsort(-np.asarray(rrf), kind="stable")
        sub = mat[order]
        gram = sub @ sub.T
        gram[~mask[order], :] = -np.inf
        gram[:, ~mask[order]] = -np.inf
        gram[_upper_triangle(n)] = -np.inf
        best = gram.max(axis=1)
        dup = np.full(n, np.nan, dtype=np.float32)
        dup[order] = np.where(np.isfinite(best) & mask[order], best, np.nan)
        put("duplicate_similarity", dup)

    # 3. words
    q_terms = terms(ctx.question)
    seed_names = prepare_names({" ".join(n.lower().split()) for n in ctx.seeds})
    question_words = set(_WORD.findall(ctx.question.lower()))
    hits, seeds_named, author_named, author_asker = [], [], [], []
    shared: list[frozenset[str]] = []  # the question's terms each text holds
    for c in candidates:
        held = terms(c.text)
        if c.source is not None and c.source.section:  # its outermost section's words, as
            held = held | terms(c.source.section[0][1])  # the lexical vector holds them
        shared.append(q_terms & held)
        h = len(shared[-1])
        hits.append(float(h))
        seeds_named.append(float(len(names_in(c.text, seed_names))) if seed_names else 0.0)
        author = (c.author or "").strip().lower()
        first = _first_name(author)
        author_named.append(float(len(first) >= 2 and first in question_words))
        author_asker.append(float(bool(author) and ctx.asker is not None
                                  and author == ctx.asker.strip().lower()))
    put("term_hits", hits)
    put("term_share", [h / len(q_terms) if q_terms else 0.0 for h in hits])
    # The question's terms weighted by how rare they are in this pool: the term every candidate
    # holds (often the asker's subject) counts for less than the one only a few do.
    if q_terms:
        df = Counter(t for ts in shared for t in ts)
        weight = {t: math.log((n + 1) / (df[t] + 0.5)) for t in q_terms}
        total = sum(weight.values()) or 1.0
        put("term_weight_share", [sum(weight[t] for t in ts) / total for ts in shared])
    else:
        put("term_weight_share", [0.0] * n)
    put("question_type", [question_type(ctx.question)] * n)
    shapes = np.asarray([mentions(c.text) for c in candidates], dtype=np.float32)
    out[:, [col["time_mentions"], col["number_mentions"], col["name_mentions"]]] = shapes
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
    # Context needs the time the item happened at: when it was written or stored says nothing
    # (a folder ingested at once would make every document every other's neighbour).
    _near(out, col, [c.occurred_at for c in candidates], rrf, best_rrf)

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
