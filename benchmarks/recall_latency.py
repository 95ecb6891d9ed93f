"""Recall latency: p50/p95 per stage and total; RLS vs superuser; one statement vs lanes apart.

Builds a synthetic corpus of ``--chunks`` one-chunk documents spread over
``--tenants`` tenants with skewed sizes (the largest tenant holds ``--largest``
of the corpus, the rest share the remainder), embeds them with the packaged
MiniLM, then asks ``--queries`` questions in the largest and the smallest
tenant. Figures printed:

* p50/p95 of every recall stage (from the trace) and of the whole call;
* the recall statement as ``engram_app`` under forced RLS vs the same statement
  run by the superuser (RLS bypassed) with the same identity bound: the ratio
  is the price of the authorization boundary (goal: at most 1.15x);
* the one statement vs its lanes issued as separate statements (dense-only,
  bm25-only, title and catalog shapes one after another in one transaction).

    .venv/bin/python benchmarks/recall_latency.py [--chunks 2000] [--tenants 5]
        [--largest 0.3] [--queries 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from recall_quality import embedded_database, make_tenant

from orchestrator.auth import Identity
from orchestrator.ingest.documents import DocumentInput
from orchestrator.recall import PLAN_STUDY, Recaller
from orchestrator.recall.plan import FULL_PLAN, PlanShape

WORDS = tuple(
    """
budget hiring office move garden tomato train signal cancelled sourdough starter boiler
service invoice contract release key quarterly plan review design database index vector
lexical memory recall trip kyoto temple exam grammar kanji window weekly project roof
repair visa embassy cello lesson dentist appointment
""".split()  # noqa: SIM905 - one long word list, wrapped
)


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))]


def sentence(rng: random.Random, n: int = 18) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def timed_statement(engine: Engine, identity: Identity, stmt: Any, params: dict[str, Any]
                    ) -> float:
    with Session(engine) as session, session.begin():
        session.execute(select(func.auth.bind_identity(
            identity.org_id, identity.user_id, sorted(identity.read_scopes),
            sorted(identity.write_scopes))))
        t = time.perf_counter()
        session.execute(stmt, params).all()
        return (time.perf_counter() - t) * 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--tenants", type=int, default=5)
    ap.add_argument("--largest", type=float, default=0.3)
    ap.add_argument("--queries", type=int, default=30)
    args = ap.parse_args()
    rng = random.Random(7)

    from orchestrator.worker.embedder import Embedder
    from tests.support.recall import write_documents

    # Skewed tenant sizes: the largest holds --largest of the corpus, the others
    # halve in turn (the last ones are the 0.1%-sized tenants at larger sizes).
    sizes = [max(1, int(args.chunks * args.largest))]
    weights = [0.5 ** i for i in range(1, args.tenants)]
    rest = args.chunks - sizes[0]
    sizes += [max(1, int(rest * w / sum(weights))) for w in weights]
    with embedded_database() as (settings, admin, app):
        embedder = Embedder.from_settings(settings)
        orgs = []
        t0 = time.perf_counter()
        for n, size in enumerate(sizes):
            org = f"bench-{n}-{uuid.uuid4().hex[:6]}"
            make_tenant(admin, org, "team")
            ident = Identity.of(org, "writer", write=["team"])
            docs = [DocumentInput(collection="notes", path=f"d{i}.md", title=f"Note {n}-{i}",
                                  body=sentence(rng), scopes=("team",),
                                  kind="project" if i % 50 == 0 else "note",
                                  state="Active" if i % 50 == 0 else None,
                                  area=rng.choice(("Home", "Work", "Study")))
                    for i in range(size)]
            for start in range(0, len(docs), 500):
                write_documents(app, ident, embedder, docs[start:start + 500], settings)
            orgs.append(org)
        print(f"corpus: {sum(sizes)} chunks in {len(sizes)} tenants {sizes}, built in "
              f"{time.perf_counter() - t0:.0f}s")

        recaller = Recaller(app, settings, embedder=embedder)
        print(f"reranker: {'available' if recaller.reranker.available else 'unavailable'}")
        questions = [" ".join(rng.choice(WORDS) for _ in range(6)) + "?"
                     for _ in range(args.queries)]
        for label, org, size in (("largest-share", orgs[0], sizes[0]),
                                 ("smallest", orgs[-1], sizes[-1])):
            ident = Identity.of(org, "reader", read=["team"])
            recaller.recall(ident, "warm up the caches")
            stages: dict[str, list[float]] = defaultdict(list)
            app_ms, su_ms, one_ms, apart_ms = [], [], [], []
            full = recaller.statement(FULL_PLAN)
            lanes: list[PlanShape] = [
                PLAN_STUDY["dense-only"], PLAN_STUDY["bm25-only"],
                FULL_PLAN.without("title-only", dense=False, lexical=False, catalogs=False),
                FULL_PLAN.without("catalogs-only", dense=False, lexical=False, title=False),
            ]
            for q in questions:
                t = time.perf_counter()
                _, trace = recaller.trace(ident, q)
                stages["total"].append((time.perf_counter() - t) * 1000.0)
                for k, v in trace.timings_ms.items():
                    stages[k].append(v)
                params = {"question": q, "query_embedding": embedder.embed_query(q)}
                app_ms.append(timed_statement(app, ident, full, params))
                su_ms.append(timed_statement(admin, ident, full, params))
                one_ms.append(app_ms[-1])
                with Session(app) as session, session.begin():
                    session.execute(select(func.auth.bind_identity(org, "reader", ["team"], [])))
                    t = time.perf_counter()
                    for shape in lanes:
                        session.execute(recaller.statement(shape), params).all()
                    apart_ms.append((time.perf_counter() - t) * 1000.0)
            print(f"\n{label} tenant ({size} chunks), {len(questions)} queries, ms:")
            print(f"  {'stage':14s} {'p50':>8s} {'p95':>8s}")
            for k, v in stages.items():
                print(f"  {k:14s} {pct(v, 0.5):8.2f} {pct(v, 0.95):8.2f}")
            a, s = statistics.median(app_ms), statistics.median(su_ms)
            print(f"  statement as engram_app (RLS) p50 {a:.2f}, as superuser p50 {s:.2f}: "
                  f"ratio {a / s:.3f}")
            o, p = statistics.median(one_ms), statistics.median(apart_ms)
            print(f"  one statement p50 {o:.2f} vs lanes as {len(lanes)} statements p50 "
                  f"{p:.2f}: ratio {o / p:.3f}")


if __name__ == "__main__":
    main()
