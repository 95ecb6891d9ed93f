"""Recall quality on LoCoMo dev: evidence recall@5/10/20 and nDCG@10, full plan vs plan study.

Each conversation is its own tenant; each dialogue turn is a document written
as its speaker (the bound user, so the speaker is the author) with the text
``"{speaker}: {text}"`` and the turn's ``dia_id`` as its path. Every question
is asked as recall under that tenant's identity and scored over the distinct
turns of the ranking before the budget cut, with the metric definitions of
``shared/data/README.md``. BM25 (bm25s, English stemmer) and exact dense search
(numpy over the same MiniLM embeddings) run in the same process as external
references.

    .venv/bin/python benchmarks/recall_quality.py [--data PATH] [--conversations N]
        [--questions N] [--shapes full,dense-only,...]
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
from datetime import UTC, datetime
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
    questions: list[tuple[str, list[str]]]  # question, evidence dia_ids


def load(path: Path, limit: int | None) -> list[Conversation]:
    data = json.loads(path.read_text())
    out = []
    for item in data[:limit]:
        conv = item["conversation"]
        turns = []
        n = 1
        while f"session_{n}" in conv:
            for t in conv[f"session_{n}"]:
                turns.append((t["dia_id"], t["speaker"], t["text"]))
            n += 1
        ids = {t[0] for t in turns}
        qs = []
        for qa in item["qa"]:
            ev = [e for e in qa.get("evidence") or [] if e in ids]
            if ev:
                qs.append((qa["question"], ev))
        out.append(Conversation(item["sample_id"], turns, qs))
    return out


@contextmanager
def embedded_database() -> Iterator[tuple[Settings, Engine, Engine]]:
    """A fresh embedded server in a temporary home, migrated; (settings, admin, app)."""

    with scratch_database() as db:
        admin = create_engine(db.admin_url())
        app = make_app_engine(db.app_url())
        try:
            yield db.settings, admin, app
        finally:
            app.dispose()
            admin.dispose()


def make_tenant(admin: Engine, org: str, scope: str = "memory") -> None:
    with admin.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        conn.execute(text("select auth.create_scope(:t, :n, :d)"),
                     {"t": tid, "n": scope, "d": "Conversation memory"})


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
                    body=f"{spk}: {body}", scopes=("memory",), kind="memory"), settings)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--conversations", type=int, default=None)
    ap.add_argument("--questions", type=int, default=None, help="per conversation")
    ap.add_argument("--shapes", default="full,dense-only,bm25-only,no-title")
    args = ap.parse_args()

    import bm25s
    import Stemmer

    from orchestrator.worker.embedder import Embedder

    convs = load(args.data, args.conversations)
    shapes = [PLAN_STUDY[s] for s in args.shapes.split(",")]
    results: dict[str, list[dict[str, float]]] = defaultdict(list)
    timings: dict[str, float] = defaultdict(float)
    with embedded_database() as (settings, admin, app):
        embedder = Embedder.from_settings(settings)
        recaller = Recaller(app, settings, embedder=embedder)
        rr = recaller.reranker
        print(f"reranker: {'available' if rr.available else 'unavailable'} "
              f"({getattr(rr, 'note', '') or getattr(rr, 'model_name', '')})")
        stemmer = Stemmer.Stemmer("english")
        for conv in convs:
            org = f"locomo-{conv.sample_id}-{uuid.uuid4().hex[:6]}"
            make_tenant(admin, org)
            t0 = time.perf_counter()
            vectors = ingest_conversation(app, settings, embedder, org, conv)
            print(f"{conv.sample_id}: {len(conv.turns)} turns ingested in "
                  f"{time.perf_counter() - t0:.1f}s; {len(conv.questions)} questions")
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
    n = len(results["ref: exact dense"])
    print(f"\nquestions scored: {n}")
    print(f"{'system':28s} {'R@5':>6s} {'R@10':>6s} {'R@20':>6s} {'nDCG@10':>8s} {'ms/q':>7s}")
    for name, rows in results.items():
        m = mean(rows)
        shape_name = name.removeprefix("engram: ")
        ms = f"{1000 * timings[shape_name] / n:7.1f}" if shape_name in timings else "      -"
        print(f"{name:28s} {m['recall@5']:6.3f} {m['recall@10']:6.3f} {m['recall@20']:6.3f} "
              f"{m['ndcg@10']:8.3f} {ms}")
    base = mean(results["ref: BM25 (bm25s)"])["recall@10"]
    full = mean(results.get("engram: full", results["ref: exact dense"]))["recall@10"]
    print(f"\nfull plan recall@10 / BM25 reference recall@10 = {full / base:.3f}")


if __name__ == "__main__":
    main()
