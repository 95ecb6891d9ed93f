"""The Python tail of recall: candidates from the statement's rows, ordering, duplicates, budget.

Order of work, each step visible in the trace:

1. ``candidates_from_rows``: one candidate per item (a source chunk, a claim, a
   summary, a session note, ...); the Area and the Project catalog rows fold into
   one catalog candidate each;
2. ``apply_precedence``: claims a keyed fact outranks are dropped (recall keeps
   ``beaten_by is null``), observations under the confidence gate are dropped,
   and prose whose extracted claims a keyed fact contradicts loses to that keyed
   fact: the keyed fact takes the prose's place and direct bit, the prose moves
   below every candidate that is not contradicted;
3. merit: the cross-encoder's score over the full candidate text when the
   reranker is available, else the learned ranker's score (``recall.ranker``),
   else the fused (RRF) score; min-max normalised within the pool so the pinned
   boost (+0.3 by default) has a fixed meaning;
4. ``order``: directly named sources first, merit order inside each group, ties
   broken by meaningful keys (``stable_key``: document, position, kind, text),
   never by a random id, so the same data ingested twice orders the same way;
5. ``served_once``: first ``drop_redundant_derived``: a derived item (a fact, an
   observation) whose text a source excerpt of the pool holds is served by that
   excerpt (dropped below it; above it, the excerpt takes its place), so derived
   memory is served only where it adds to the sources it was derived from; then
   ``suppress_duplicates``: a candidate too similar to one already kept (cosine of the
   chunk embeddings, or identical text) is dropped; MMR (``recall.mmr``) then trades
   relevance against novelty;
6. ``budget_cut``: the longest prefix whose rendered cost fits the budget. The
   cost is measured on the rendered string itself (characters / chars-per-token,
   rounded up), so the result can never exceed the budget, headers included.
"""

from __future__ import annotations

import math
import re
import unicodedata
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any

import numpy as np

from orchestrator.db.knowledge_models import RECALLABLE_CONFIDENCE
from orchestrator.markdown import code_fences, extend_trail
from orchestrator.recall.result import Evidence, FactRef, Provenance, ScopeRef, SourceRef, section_of

CLAIMS = "knowledge.fact_claim"
# What each lane's items are, as the prompt may call them (never how they were found).
ITEM_KINDS = {
    "sources.chunks": "excerpt",
    CLAIMS: "fact",
    "memory.communities": "community summary",
    "memory.raptor_nodes": "summary",
    "memory.working_memory": "session note",
    "memory.profiles": "profile",
    "memory.episodes": "episode",
    "memory.observations": "observation",
    "memory.decisions": "decision",
}
SOURCE_RANKS = ("dense", "lexical", "title")


# Characters of inline Markdown or HTML markup (code spans, emphasis, links, images, tags):
# a statement and an excerpt are compared without them (``Candidate.bare_text``).
_MARKUP_CHARS = "[]`*_<>!~"
_MARKUP = re.compile("[" + re.escape(_MARKUP_CHARS) + "]")
_NO_MARKUP = str.maketrans(dict.fromkeys(_MARKUP_CHARS, " "))


@dataclass
class Candidate:
    """One item the tail may select; lane facts are kept for the trace only."""

    key: str
    kind: str  # source | area_catalog | project_catalog | the ITEM_KINDS of memory items
    text: str
    scopes: tuple[ScopeRef, ...]
    provenance: Provenance = Provenance.SOURCE_EXCERPT
    source: SourceRef | None = None
    item_table: str | None = None
    item_id: uuid.UUID | None = None
    fact: FactRef | None = None
    occurred_at: datetime | None = None
    ended_at: datetime | None = None
    session_id: str | None = None
    confidence: float | None = None
    relation: str | None = None
    related_id: uuid.UUID | None = None
    beaten_by: uuid.UUID | None = None
    contradicted_by: str | None = None
    outcome: str | None = None
    document_id: uuid.UUID | None = None
    chunk_id: uuid.UUID | None = None
    char_start: int | None = None
    char_end: int | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    author: str | None = None
    embedding: Any = None
    direct: bool = False
    pinned: bool = False
    lanes: dict[str, Any] = field(default_factory=dict)
    rrf: float = 0.0
    rerank: float | None = None
    learned: float | None = None
    merit: float = 0.0

    # Computed once per candidate and shared by duplicate suppression, the learned ranker's
    # features, MMR and the redundant-derived check (a candidate's text and embedding are
    # never changed after it is built).
    @cached_property
    def unit(self) -> np.ndarray[Any, Any] | None:
        """The embedding scaled to length 1 (float32), or None without one or with length 0
        (``unit_rows`` computes it for a whole pool at once; this is the same, for one)."""
        _fill_units([self])
        return vars(self)["unit"]  # type: ignore[no-any-return]

    @cached_property
    def navigation(self) -> bool:
        """Whether this is a source chunk that is a table of contents or a list of links
        (``navigational``): asked by the discount and by the direct bit, computed once."""
        return self.kind == "source" and navigational(self.text)

    @cached_property
    def flat_text(self) -> str:
        """The text with whitespace runs as one space, case-folded: what "the same text" means."""
        return " ".join(self.text.split()).lower()

    @cached_property
    def bare_text(self) -> str:
        """``flat_text`` without inline Markdown and HTML markup characters (whitespace runs
        as one space again), so "the [`--test`][] flag" and a fact's "the `--test` flag" read
        the same. ``str.translate``: a few microseconds a chunk, paid only when asked."""
        if _MARKUP.search(self.flat_text) is None:
            return self.flat_text
        return " ".join(self.flat_text.translate(_NO_MARKUP).split())

    def evidence(self) -> Evidence:
        return Evidence(
            text=self.text, provenance=self.provenance, scopes=self.scopes, source=self.source,
            created_at=self.created_at, updated_at=self.updated_at, author=self.author,
            document_id=self.document_id, chunk_id=self.chunk_id, char_start=self.char_start,
            char_end=self.char_end,
            kind={"source": "excerpt", "area_catalog": "catalog",
                  "project_catalog": "catalog"}.get(self.kind, self.kind),
            item_table=self.item_table, item_id=self.item_id, fact=self.fact,
            occurred_at=self.occurred_at, ended_at=self.ended_at,
        )


def _scopes(value: Any) -> tuple[ScopeRef, ...]:
    return tuple(ScopeRef(str(s["name"]), str(s.get("description") or "")) for s in value or ())


def _merge_scopes(a: tuple[ScopeRef, ...], b: tuple[ScopeRef, ...]) -> tuple[ScopeRef, ...]:
    return tuple(sorted({*a, *b}, key=lambda s: s.name))


def _lane_facts(found: Mapping[str, Any] | None) -> dict[str, Any]:
    """The trace's view of the lanes that found an item: ranks and scores per lane."""
    out: dict[str, Any] = {}
    for lane, (rank, score) in sorted((found or {}).items()):
        if lane == "dense":
            out.update(dense_rank=rank, dense_distance=score)
        elif lane == "lexical":
            out.update(lexical_rank=rank, bm25=score)
        elif lane == "title":
            out["title_rank"] = rank
        else:
            out[f"{lane}_rank"] = rank
            if score is not None:
                out[f"{lane}_distance"] = score
    return {k: v for k, v in out.items() if v is not None}


def _fact(row: Mapping[str, Any]) -> FactRef:
    return FactRef(subject=row["subject"], predicate=row["predicate"], object=row["object"],
                   epistemic_kind=row["epistemic_kind"], perspective_key=row["perspective_key"],
                   author_role=row["author_role"], fact_key=row["fact_key"], as_of=row["as_of"])


def _item(row: Mapping[str, Any]) -> Candidate:
    table = row["item_table"]
    scopes = _scopes(row["scope_objects"])
    common: dict[str, Any] = {
        key: row[key] for key in ("item_id", "embedding", "author", "created_at", "updated_at",
                                  "occurred_at", "ended_at", "session_id", "confidence", "relation",
                                  "related_id", "beaten_by", "outcome")}
    common.update(scopes=scopes, item_table=table, lanes=_lane_facts(row["lane_ranks"]),
                  rrf=float(row["rrf"] or 0.0), pinned=bool(row["pinned"]))
    if table == "sources.chunks":
        return Candidate(
            key=f"chunk:{row['chunk_id']}", kind="source", text=row["text"],
            source=SourceRef(row["collection"], row["path"], row["title"],
                             section_of(row["section"])),
            document_id=row["document_id"], chunk_id=row["chunk_id"],
            char_start=row["char_start"], char_end=row["char_end"], direct=bool(row["direct"]),
            **common)
    kind = ITEM_KINDS[table]
    text = row["text"]
    if table == CLAIMS:
        fact = _fact(row)
        common["fact"] = fact
        if fact.fact_key is not None:
            kind = "keyed fact"
    elif table == "memory.raptor_nodes" and row["relation"] == "root":
        kind = "overview"
    elif table == "memory.working_memory":
        return Candidate(key=f"{table}:{row['item_id']}", kind=kind, text=text,
                         provenance=Provenance.RECENT_SESSION_MEMORY, **common)
    return Candidate(key=f"{table}:{row['item_id']}", kind=kind, text=text,
                     provenance=Provenance.DERIVED_MEMORY, **common)


def candidates_from_rows(rows: Sequence[Mapping[Any, Any]], *, catalog_rrf: float
                         ) -> tuple[list[Candidate], dict[str, Any]]:
    """Candidates, and what the statement said about the corpus and the seeds (for the trace)."""
    out: list[Candidate] = []
    corpus: dict[str, Any] = {"seeds": []}
    areas: dict[str, tuple[tuple[ScopeRef, ...], datetime | None]] = {}
    projects: list[Mapping[str, Any]] = []
    for row in rows:
        lane = row["lane"]
        if lane == "area":
            areas[row["area"]] = (_scopes(row["scope_objects"]), row["updated_at"])
        elif lane == "project":
            projects.append(row)
        elif lane == "lexical_stats":
            corpus.update(chunks=int(row["item_count"] or 0), avg_length=row["bm25"])
        elif lane == "lexical_term":
            corpus.setdefault("terms", []).append(
                (row["text"], int(row["item_count"] or 0), int(row["lane_rank"] or 0)))
        elif lane == "title_common":
            corpus.setdefault("common_titles", []).append(
                (row["text"], int(row["item_count"] or 0), int(row["lane_rank"] or 0)))
        elif lane == "seed":
            corpus["seeds"].append(row["subject"])
        elif lane == "hydration_dropped":
            corpus.setdefault("hydration_dropped", []).append(Dropped(
                f"{row['title']} #{row['chunk_id']}", str(row["relation"]),
                _lane_facts(row["lane_ranks"]), float(row["rrf"] or 0.0)))
        else:
            out.append(_item(row))
    corpus["seeds"].sort()
    if areas:
        scopes = tuple[ScopeRef, ...]()
        lines = []
        for name in sorted(areas):
            scopes = _merge_scopes(scopes, areas[name][0])
            lines.append(f"- {name}")
        out.append(Candidate(
            key="catalog:areas", kind="area_catalog", text="Areas:\n" + "\n".join(lines),
            scopes=scopes, provenance=Provenance.DERIVED_MEMORY,
            updated_at=max((a[1] for a in areas.values() if a[1] is not None), default=None),
            lanes={"areas": len(areas)}, rrf=catalog_rrf,
        ))
    if projects:
        scopes = tuple[ScopeRef, ...]()
        lines = []
        for row in projects:
            scopes = _merge_scopes(scopes, _scopes(row["scope_objects"]))
            lines.append(f"- {row['title']}: {row['state']} | area {row['area'] or 'none'}")
        out.append(Candidate(
            key="catalog:projects", kind="project_catalog",
            text="Current projects (Active or Waiting):\n" + "\n".join(lines), scopes=scopes,
            provenance=Provenance.DERIVED_MEMORY,
            updated_at=max((r["updated_at"] for r in projects if r["updated_at"]), default=None),
            lanes={"projects": len(projects)}, rrf=catalog_rrf,
        ))
    # In fused order, ties by meaningful keys: the statement's row order follows its plan and
    # the random row ids, and the ranker's features read the list in order (what is fused
    # "above" a candidate, the best source's time), as does training: the same data ingested
    # twice must give the same features and the same models.
    out.sort(key=lambda c: (-c.rrf, stable_key(c)))
    return out, corpus


@dataclass(frozen=True)
class Dropped:
    """A source candidate a lane found whose document hydration left out (archived or
    snoozed): visible to the caller, never served."""

    label: str
    reason: str
    lanes: dict[str, Any]
    rrf: float


@dataclass
class Precedence:
    """What ``apply_precedence`` changed, for the trace."""

    beaten_claims: list[tuple[Candidate, uuid.UUID]] = field(default_factory=list)
    below_gate: list[Candidate] = field(default_factory=list)
    contradicted: list[tuple[Candidate, Candidate | None]] = field(default_factory=list)


def apply_precedence(candidates: list[Candidate]) -> tuple[list[Candidate], Precedence]:
    """Keyed facts over contradicting claims and prose; the observation confidence gate.

    Runs after merit is assigned: a contradicted prose candidate hands its place (merit
    and direct bit) to the keyed fact that beats it and sinks below every candidate that
    is not contradicted.
    """
    report = Precedence()
    claims = {c.item_id: c for c in candidates if c.item_table == CLAIMS and c.beaten_by is None}
    kept: list[Candidate] = []
    for c in candidates:
        if c.item_table == CLAIMS and c.beaten_by is not None:
            report.beaten_claims.append((c, c.beaten_by))
            continue
        if c.kind == "observation" and (c.confidence or 0.0) < RECALLABLE_CONFIDENCE:
            report.below_gate.append(c)
            continue
        kept.append(c)
    floor = min((c.merit for c in kept), default=0.0)
    for c in kept:
        if c.item_table != CLAIMS and c.beaten_by is not None:
            winner = claims.get(c.beaten_by)
            if winner is not None:
                winner.merit = max(winner.merit, c.merit)
                winner.direct = winner.direct or c.direct
                c.contradicted_by = winner.key
            else:
                c.contradicted_by = f"{CLAIMS}:{c.beaten_by}"
            c.direct = False
            c.merit = floor - 1.0 + c.merit / 2
            report.contradicted.append((c, winner))
    return kept, report


# Words that do not make a title's phrase longer: "a security" names no more than "security".
_PHRASE_FILLER = frozenset({"a", "an", "the", "of", "in", "on", "for", "to", "and", "or", "is",
                            "are", "was", "be", "what", "who", "how", "why", "when", "where",
                            "which", "do", "does", "did", "can", "my", "our", "your", "its",
                            "their", "with", "by", "from", "at", "about", "as", "i", "we"})
_NOT_WORD = re.compile(r"[\W_]+")


def title_words(text: str) -> list[str]:
    """``text``'s words as ``recall.title_key`` keys a title: lower case, unaccented, split at
    every run of characters that are no letter or digit. Compared only with itself (the
    question's words with the candidates' titles'): where Python's NFKD and PostgreSQL's
    unaccent differ ("ø"), both sides still read alike, and at worst a title is not found
    in the question and nothing is narrowed."""
    plain = "".join(ch for ch in unicodedata.normalize("NFKD", text.lower())
                    if not unicodedata.combining(ch))
    return [w for w in _NOT_WORD.split(plain) if w]


def _named_documents(candidates: list[Candidate]) -> dict[uuid.UUID, str]:
    """The title of each document a candidate of which is a direct subject."""
    return {c.document_id: c.source.title for c in candidates
            if c.direct and c.source is not None and c.document_id is not None}


def narrower_subjects(question: str, candidates: list[Candidate]) -> list[tuple[str, str, str]]:
    """Clear the direct-subject bit of a document whose title the question names only as part
    of a longer phrase that another found document's title holds: "what does a security
    steward do?" names Node.js's SECURITY.md (titled "Security") by its title, but the
    question is about the steward, whom "Security Steward Onboarding/OffBoarding" is about;
    the page titled "Security" was served first, over both lanes' first two (stop 45). The
    phrase is the title with the question's next or previous word (no article, preposition or
    question word: ``_PHRASE_FILLER``); the other title must belong to a candidate that is no
    direct subject (a named title inside another named title is the statement's rule). Runs
    before the ranker, whose ``direct`` feature then reads the bit as cleared. Returns
    (title, phrase, the other title) for the trace."""
    named = _named_documents(candidates)
    if not named:
        return []  # most recalls name no title: nothing to read
    question_words = title_words(question)
    titles = {c.source.title for c in candidates if c.source is not None and not c.direct}
    others = {" " + " ".join(title_words(t)) + " ": t for t in sorted(titles)}
    narrower: dict[uuid.UUID, tuple[str, str, str]] = {}
    for document, title in named.items():
        words = title_words(title)
        n = len(words)
        if not n:
            continue
        for i in range(len(question_words) - n + 1):
            if question_words[i:i + n] != words:
                continue
            phrases = [question_words[j:k] for j, k, extra in (
                (i - 1, i + n, i - 1), (i, i + n + 1, i + n))
                if 0 <= extra < len(question_words)
                and question_words[extra] not in _PHRASE_FILLER]
            found = next(((" ".join(p), other) for p in phrases for key, other in others.items()
                          if f" {' '.join(p)} " in key), None)
            if found is not None:
                narrower[document] = (title, *found)
                break
    for c in candidates:
        if c.direct and c.document_id in narrower:
            c.direct = False
    return sorted(narrower.values())


# The words by which a question names a catalog ("which projects are active?", "what areas
# do I have?"): the plural, as one asks for the list; "the project" names one project, whose
# own note the title lane finds.
CATALOG_WORDS = {"project_catalog": frozenset({"projects"}), "area_catalog": frozenset({"areas"})}


def named_catalogs(question: str, candidates: list[Candidate]) -> list[str]:
    """Set the direct-subject bit of a catalog the question asks for by its name: "which
    projects are active?" is the Project catalog's question, which ranked twelfth of eighteen
    on a vault's notes (a catalog has one fixed fused score, and no ranker was trained on
    catalogs) and the budget cut it. Returns the kinds, for the trace."""
    words = set(title_words(question))
    named = [c for c in candidates if words & CATALOG_WORDS.get(c.kind, frozenset())]
    for c in named:
        c.direct = True
    return sorted(c.kind for c in named)


def unfound_subjects(question: str, candidates: list[Candidate]) -> list[str]:
    """Clear the direct-subject bit of a document named by a one-word title that neither the
    dense nor the lexical lane found, when the question asks about more than the title.
    CMake's reference names a page for each command, and its titles are words a question
    uses for other ends: "how do I set the C++ standard for a target?" named the page of the
    ``set`` command, served first three times, while both lanes' first forty (compile
    features, ``target_compile_features``) held no chunk of it (stop 46). A one-word title
    is a weak name; when the rest of the question finds nothing of its page, the page is no
    subject and competes on merit. A longer title, a page either lane found, or a question
    that is the title alone ("what does set do?" holds only "set" as a term) keep it. Only
    for plans with both lanes on. Returns the titles, for the trace."""
    named = _named_documents(candidates)
    if not named:
        return []
    found = {c.document_id for c in candidates if "dense_rank" in c.lanes or "lexical_rank" in c.lanes}
    question_words = set(title_words(question))
    weak = {document: title for document, title in named.items() if document not in found
            and len(words := title_words(title)) == 1 and words[0] in question_words}
    if not weak:
        return []
    from orchestrator.recall.features import terms  # features reads this module

    asked = terms(question)
    cleared = {document: title for document, title in weak.items() if asked - terms(title)}
    for c in candidates:
        if c.direct and c.document_id in cleared:
            c.direct = False
    return sorted(set(cleared.values()))


def keep_direct_best(candidates: list[Candidate], per_document: int,
                     navigation: bool = True) -> list[Candidate]:
    """Keep the direct-subject bit on the ``per_document`` best chunks (by merit, then the
    stable key) of each directly named document; its other chunks lose it and compete on
    merit like any evidence. The statement marks every chunk of a named document that a
    lane found (the ranker's ``direct`` feature), so without this a long named document
    filled the whole budget before any other evidence. With ``navigation`` (the
    navigation rule on: ``recall_navigation_discount`` below 1), a chunk that is a table of
    contents or a link list (``navigational``) loses it too while a chunk of its document
    that is neither was found: what the named document says comes first, not where it
    links. Returns the chunks that lost it."""
    by_document: dict[uuid.UUID, list[Candidate]] = {}
    for c in candidates:
        if c.direct and c.source is not None and c.document_id is not None:
            by_document.setdefault(c.document_id, []).append(c)
    lost: list[Candidate] = []
    for chunks in by_document.values():
        if navigation and len(chunks) > 1:
            links = [c for c in chunks if c.navigation]
            if links and len(links) < len(chunks):
                for c in links:
                    c.direct = False
                    lost.append(c)
                chunks = [c for c in chunks if c.direct]
        for c in sorted(chunks, key=lambda c: (-c.merit, stable_key(c)))[per_document:]:
            c.direct = False
            lost.append(c)
    return lost


def assign_merit(candidates: list[Candidate], pin_boost: float) -> None:
    """Merit in [0, 1] (+ boost when pinned): the cross-encoder's score when present, else
    the learned ranker's, else RRF."""
    reranked = [c.rerank for c in candidates if c.rerank is not None]
    values: list[float]
    if reranked:
        # Items the reranker did not score rank below every scored one.
        floor = min(reranked)
        values = [c.rerank if c.rerank is not None else floor - 1.0 + c.rrf for c in candidates]
    elif any(c.learned is not None for c in candidates):
        values = [c.learned if c.learned is not None else c.rrf for c in candidates]
    else:
        values = [c.rrf for c in candidates]
    lo, hi = (min(values), max(values)) if values else (0.0, 0.0)
    for c, v in zip(candidates, values, strict=True):
        c.merit = 1.0 if hi == lo else (v - lo) / (hi - lo)
        if c.pinned:
            c.merit += pin_boost


# A list item that is only a link ("* [Windows](#windows-1)", "- [Labels][]",
# "1. [Install](install.md)"): a line of a table of contents or a link list.
_LINK_ITEM = re.compile(r"[ \t]*(?:[-*+]|\d{1,3}[.)])[ \t]+\[[^\]\n]{1,300}\]"
                        r"(?:\([^)\s]{0,500}\)|\[[^\]\n]{0,300}\])?[ \t]*")
# A link reference definition ("[pypi]: https://pypi.org/", "[`path.posix`]: #pathposix
# 'title'"): where a document's reference-style links point, usually gathered at its end.
_LINK_DEFINITION = re.compile(r" {0,3}\[[^\]\n]{1,300}\]:[ \t]*\S{1,500}"
                              r"(?:[ \t]+(?:\"[^\"\n]*\"|'[^'\n]*'|\([^)\n]*\)))?[ \t]*")
# A Sphinx/MyST table-of-contents directive ("```{toctree}"): its lines are page names and
# options, neither a link nor prose; they count for neither side.
_TOCTREE = re.compile(r"(?:`{3,}|~{3,})[ \t]*\{toctree\}")


_ITEM_MARKS = frozenset("-*+0123456789")
NAVIGATION_MIN_ITEMS = 5
NAVIGATION_SHARE = 0.6


def navigational(text: str) -> bool:
    """Whether a chunk is mostly a table of contents or a list of links: five or more lines
    that are a link and nothing else (a list item holding only a link, or a link reference
    definition), and at least 60% of its non-blank lines outside a ``{toctree}`` directive.
    Such a chunk repeats a document's headings (every word a question shares with the
    document) or its link targets, and says nothing the sections it links to do not."""
    if text.count("]") < NAVIGATION_MIN_ITEMS:
        return False  # too few links to be one (most chunks: one count, no scan)
    toctrees = [(a, b) for a, b in code_fences(text) if _TOCTREE.match(text, a)]
    items = lines = 0
    at = 0
    for raw in text.splitlines(keepends=True):
        start, at = at, at + len(raw)
        line = raw.rstrip("\r\n")
        bare = line.lstrip()
        if not bare:
            continue
        first = start + len(line) - len(bare)
        if any(a <= first < b for a, b in toctrees):
            continue
        lines += 1
        if "[" not in bare:
            continue
        if (bare[0] in _ITEM_MARKS and _LINK_ITEM.fullmatch(line)) or (
                bare[0] == "[" and _LINK_DEFINITION.fullmatch(line)):
            items += 1
    return items >= NAVIGATION_MIN_ITEMS and items >= NAVIGATION_SHARE * lines


def discount_navigation(candidates: Sequence[Candidate], discount: float) -> int:
    """Scale the merit of every source chunk that is a table of contents or a link list
    (``navigational``) by ``discount``; returns how many were (none at 1: the rule is off)."""
    found = 0
    if discount >= 1.0:
        return found
    for c in candidates:
        if c.navigation:
            c.merit *= discount
            found += 1
    return found


# A deprecation notice at the start of a line: "*Deprecated since version 3.0:* Use
# execute_process() instead." (a reStructuredText ``deprecated`` directive as ingest stores
# it), "Stability: 0 - Deprecated" (Node.js's API docs), "**Deprecated**: ...", "> Deprecated:".
_DEPRECATED = re.compile(
    r"^[ \t>]*[*_]{0,2}(?:deprecated(?: since version [\w.]+)?[*_]{0,2}[ \t]*[:.]"
    r"|stability:[ \t]*0[ \t]*-[ \t]*deprecated)", re.IGNORECASE | re.MULTILINE)
# Words of a question about deprecations themselves: then the notice is what it asks for.
# Past forms only: "how do I replace text?" or "how do I remove a file?" asks no such thing.
_ASKS_DEPRECATED = re.compile(
    r"\b(deprecat\w*|obsolete|replaced|replacement|superseded|legacy|removed)\b", re.IGNORECASE)


def deprecated(text: str) -> bool:
    """Whether a chunk carries a deprecation notice (``_DEPRECATED``) at a line's start."""
    return ("eprecated" in text or "EPRECATED" in text) and _DEPRECATED.search(text) is not None


def discount_deprecated(question: str, candidates: Sequence[Candidate], discount: float) -> int:
    """Scale the merit of every source chunk with a deprecation notice by ``discount``,
    unless the question asks about deprecations (``_ASKS_DEPRECATED``); returns how many
    (none at 1: the rule is off). CMake's ``exec_program`` page opens "Deprecated since
    version 3.0: Use the execute_process() command instead", and was served first for "how
    do I run an external program while configuring?", over ``execute_process`` (stop 46).
    A directly named document keeps its place: the direct bit orders before merit."""
    found = 0
    if discount >= 1.0 or _ASKS_DEPRECATED.search(question):
        return found
    for c in candidates:
        if c.kind == "source" and deprecated(c.text):
            c.merit *= discount
            found += 1
    return found


def boost_named_days(candidates: Sequence[Candidate], days: Sequence[datetime],
                     boost: float) -> int:
    """Add ``boost`` to the merit of every candidate that happened on one of ``days`` (the
    days the question names, midnight UTC: ``recall.dates.named_days``): its ``occurred_at``
    to its ``ended_at`` (an episode's span) meets the day. Returns how many (none at 0).

    A day with few documents makes them direct subjects in the statement; this is for the
    rest: "what did Melanie show Caroline on October 13, 2023?" asks about one session of
    a long conversation, and its turns the lanes found are what answers it."""
    found = 0
    if boost <= 0.0 or not days:
        return found
    spans = [(d, d + timedelta(days=1)) for d in days]
    for c in candidates:
        if c.occurred_at is None:
            continue
        start = _aware(c.occurred_at)
        end = max(start, _aware(c.ended_at)) if c.ended_at is not None else start
        if any(start < after and end >= first for first, after in spans):
            c.merit += boost
            found += 1
    return found


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def stable_key(c: Candidate) -> tuple[Any, ...]:
    """What breaks a tie in merit and RRF: where the item is (collection, path, position),
    what it is and what it says; the random row id only when all of those are equal."""
    src = c.source
    return (src is None, src.collection if src else "", src.path if src else "",
            c.char_start or 0, c.kind, c.text, c.key)


def order(candidates: list[Candidate]) -> list[Candidate]:
    """Directly named sources first, then merit order within each group."""
    return sorted(candidates, key=lambda c: (not c.direct, -c.merit, -c.rrf, stable_key(c)))


def _fill_units(candidates: Sequence[Candidate]) -> None:
    """Compute ``unit`` for every candidate that lacks it, one matrix per dimension (a
    per-candidate norm costs a few microseconds each in numpy's call overhead alone)."""
    by_dim: dict[int, list[Candidate]] = {}
    for c in candidates:
        if "unit" in vars(c):
            continue
        if c.embedding is None:
            vars(c)["unit"] = None
        else:
            by_dim.setdefault(len(c.embedding), []).append(c)
    for group in by_dim.values():
        mat = np.stack([np.asarray(c.embedding, dtype=np.float32) for c in group])
        norms = np.linalg.norm(mat, axis=1)
        good = norms > 0
        mat[good] /= norms[good, None]
        for c, row, ok in zip(group, mat, good.tolist(), strict=True):
            vars(c)["unit"] = row if ok else None


def unit_rows(candidates: Sequence[Candidate]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(matrix of the candidates' unit embeddings, mask of the rows that have one). Rows of
    another dimension than the first embedding's are left out (zero, mask False)."""
    _fill_units(candidates)
    units = [c.unit for c in candidates]
    dim = next((len(u) for u in units if u is not None), 0)
    rows = [u for u in units if u is not None and len(u) == dim]
    if rows and len(rows) == len(units):  # the usual case: one embedding model for the pool
        return np.stack(rows), np.ones(len(rows), dtype=bool)
    mat = np.zeros((len(candidates), max(dim, 1)), dtype=np.float32)
    mask = np.asarray([u is not None and len(u) == dim for u in units], dtype=bool)
    if rows:
        mat[mask] = np.stack(rows)
    return mat, mask


def suppress_duplicates(ordered: list[Candidate], threshold: float
                        ) -> tuple[list[Candidate], list[tuple[Candidate, Candidate, float]]]:
    """Keep candidates in order, dropping any near-duplicate of one already kept."""
    mat, has = unit_rows(ordered)
    # One matrix product; ``nearest`` holds each row's highest cosine to a kept row so far,
    # so each candidate costs one comparison, and only a dropped one looks up which row.
    gram = mat @ mat.T if has.any() else None
    nearest = np.full(len(ordered), -np.inf, dtype=np.float32)
    kept: list[Candidate] = []
    kept_rows: list[int] = []  # rows of kept candidates that have a vector
    kept_texts: dict[str, Candidate] = {}
    dropped: list[tuple[Candidate, Candidate, float]] = []
    for i, c in enumerate(ordered):
        norm_text = c.flat_text
        if norm_text in kept_texts:
            dropped.append((c, kept_texts[norm_text], 1.0))
            continue
        if gram is not None and has[i] and nearest[i] >= threshold:
            sims = gram[i, kept_rows]
            best = int(np.argmax(sims))
            dropped.append((c, ordered[kept_rows[best]], float(sims[best])))
            continue
        kept.append(c)
        if gram is not None and has[i]:
            kept_rows.append(i)
            np.maximum(nearest, np.where(has, gram[i], -np.inf), out=nearest)
        kept_texts[norm_text] = c
    return kept, dropped


def _statement(c: Candidate) -> str:
    """What a derived item says, as ``bare_text`` ("" for an item that is not a statement):
    a fact's or an observation's text; a profile's without its title ("Ada Lovelace: "
    before the sentences it summarises)."""
    if c.kind in ("fact", "observation"):
        return c.bare_text
    if c.kind == "profile":
        return c.bare_text.partition(": ")[2]
    return ""


def drop_redundant_derived(ordered: list[Candidate]
                           ) -> tuple[list[Candidate], list[tuple[str, str, bool]]]:
    """A fact, an observation or a profile whose statement (``_statement``: whitespace-
    normalised, case-folded, markup characters aside: ``Candidate.bare_text``) a source excerpt
    of the pool holds is served by that excerpt, not on its own (a profile of one sentence
    says nothing its excerpt does not): the excerpt says the same in
    the source's words, with its context and provenance. The excerpt ranked above it: the item
    is dropped. The excerpt ranked below it: the excerpt takes the item's place and merit (it
    is what ranked there, in the source's words) and the item is dropped, so the excerpt is not
    served a second time further down. Where several excerpts hold the text, the highest one
    serves it. Returns the kept order and (dropped key, the excerpt's key, raised) triples."""
    sources = [c for c in ordered if c.source is not None]
    kept: list[Candidate] = []
    placed: set[int] = set()  # excerpts already in ``kept`` (in their place or raised)
    dropped: list[tuple[str, str, bool]] = []
    for c in ordered:
        if c.source is not None:
            if id(c) not in placed:
                placed.add(id(c))
                kept.append(c)
            continue
        # One pass over the bare texts: what one flat text holds, its bare text holds too.
        said = _statement(c)
        holder = next((s for s in sources if said in s.bare_text), None) if said else None
        if holder is None:
            kept.append(c)
            continue
        raised = id(holder) not in placed
        if raised:
            holder.merit = max(holder.merit, c.merit)
            placed.add(id(holder))
            kept.append(holder)
        dropped.append((c.key, holder.key, raised))
    return kept, dropped


def served_once(ordered: list[Candidate], threshold: float
                ) -> tuple[list[Candidate], list[tuple[str, str, bool]],
                           list[tuple[Candidate, Candidate, float]]]:
    """``ordered`` with each thing said once: a derived item a source excerpt holds is
    served by that excerpt (``drop_redundant_derived``), then duplicates go
    (``suppress_duplicates``). In that order: a fact is a sentence of a short turn, as near
    the turn as a duplicate, and ranked above its turn it dropped the turn as a duplicate of
    itself, so the fact was served without the words around it. Returns the order, the
    redundant items (``drop_redundant_derived``'s triples) and the duplicates dropped."""
    kept, redundant = drop_redundant_derived(ordered)
    kept, dropped = suppress_duplicates(kept, threshold)
    return kept, redundant, dropped


def trim_overlaps(evidence: Sequence[Evidence]) -> list[Evidence]:
    """``evidence`` in serving order, each excerpt without the text an excerpt of the same
    document served before it already holds: consecutive chunks overlap (``chunk_overlap_chars``
    of the one before, for retrieval), and two neighbours served together printed that
    paragraph twice. The later excerpt starts where the earlier one ends (or ends where it
    starts), its ``char_start``/``char_end`` moved with it, so ``body[char_start:char_end]``
    is still its text. An excerpt inside an earlier one is left whole (duplicate suppression
    is the judge of that). Depends only on what comes before, so a longer prefix never
    renders a shorter text."""
    out: list[Evidence] = []
    served: dict[uuid.UUID, list[tuple[int, int]]] = {}
    for e in evidence:
        first, last = e.char_start, e.char_end
        if e.kind != "excerpt" or e.document_id is None or first is None or last is None \
                or last - first != len(e.text):
            out.append(e)
            continue
        start, end, text = first, last, e.text
        for s0, e0 in served.get(e.document_id, ()):
            if s0 <= start < e0 < end:  # starts inside an earlier excerpt
                cut = e0 - start
                kept = text[cut:]
                start, text = start + cut + (len(kept) - len(kept.lstrip())), kept.lstrip()
            elif start < s0 < end <= e0:  # ends inside an earlier excerpt
                kept = text[:s0 - start].rstrip()
                end, text = start + len(kept), kept
        served.setdefault(e.document_id, []).append((first, last))
        out.append(e if text == e.text or not text.strip() else
                   part_of(e, start - first, text=text, char_start=start, char_end=end))
    return out


def part_of(e: Evidence, skipped: int, **changes: Any) -> Evidence:
    """``e`` with ``changes`` (its text a part of it), the first ``skipped`` characters of its
    text left out: its source's section trail is carried over the headings they held, so a
    part that starts under a heading of the chunk names it."""
    head = e.text[:max(skipped, 0)]
    if e.source is not None and "\n" in head:  # a heading stands on a line of its own
        trail = tuple(extend_trail(list(e.source.section), head))
        if trail != e.source.section:
            changes["source"] = replace(e.source, section=trail)
    return replace(e, **changes)


# About what the item macro adds to an evidence's text (its number, provenance, source and
# scopes lines): only the first guess of budget_cut uses it, never the cut itself.
ITEM_OVERHEAD_CHARS = 120


def token_cost(text: str, chars_per_token: float) -> int:
    return math.ceil(len(text) / chars_per_token) if text else 0


def budget_cut(evidence: Sequence[Evidence], budget_tokens: int, chars_per_token: float,
               prefixes: Callable[[Sequence[Evidence]], Callable[[int], str]]
               ) -> tuple[int, str, int]:
    """The longest prefix of ``evidence`` (in serving order, ``trim_overlaps`` applied) whose
    rendering fits: (items kept, rendered string, its cost). ``prefixes(evidence)`` gives
    ``k -> the rendering of the first k items`` (``render.render_prefixes``: each item
    rendered once however many prefixes are tried)."""
    render = prefixes(evidence)
    # A longer prefix never renders shorter, so the longest fitting prefix is found by a
    # search between [lo, hi]. Each try measures a whole prefix's string (its items are
    # rendered once and joined), so the first guess comes from the texts' lengths (each item
    # renders as its text plus a header line): usually the answer or its neighbour, two or
    # three tries, and no item past the answer rendered, instead of a bisection's log n.
    fits: dict[int, str | None] = {}

    def tried(k: int) -> bool:
        if k not in fits:
            text = render(k)
            fits[k] = text if token_cost(text, chars_per_token) <= budget_tokens else None
        return fits[k] is not None

    lo, hi = 0, len(evidence)
    tried(0)
    limit, spent, estimate = budget_tokens * chars_per_token, 0.0, 0
    for e in evidence:
        spent += len(e.text) + ITEM_OVERHEAD_CHARS
        if spent > limit:
            break
        estimate += 1
    guess: int | None = estimate
    while lo < hi:
        mid = min(max(guess, lo + 1), hi) if guess is not None else (lo + hi + 1) // 2
        guess = None  # the first step only; bisect after it
        if tried(mid):
            lo = mid
            if mid < hi and not tried(mid + 1):
                hi = mid
        else:
            hi = mid - 1
            if hi > lo and tried(hi):
                lo = hi
    lo_text = fits[lo] or ""
    return lo, lo_text, token_cost(lo_text, chars_per_token)
