"""What the learned ranker, personalized PageRank and MMR cost per recall at 200 candidates.

A pool like a recall's (``--candidates``, default 200): 384-d embeddings,
dialogue-length texts naming a few of 40 entities, a sixth of the pool claims
between them, lane ranks and scores, times, four entity seeds. Timed per
recall, ``--runs`` times each, in the same process:

* **fused tail** (the baseline): merit from RRF, the identity-aware order,
  duplicate suppression;
* **learned tail**: PPR + features + one ``predict`` with the packaged default
  model (``apply_learned``), then merit, order, duplicates, redundant derived
  items and MMR with the per-document cap;

and each stage's p50 beside the total, with the learned tail's p50 over the
fused tail's. The goal: ranker + PPR + MMR p50 <= 10 ms at 200 candidates.

    .venv/bin/python benchmarks/ranker_cost.py [--candidates 200] [--runs 200]
"""

from __future__ import annotations

import argparse
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from orchestrator.recall.features import RankContext
from orchestrator.recall.mmr import diversify
from orchestrator.recall.ranker import RankModel, apply_learned, default_model, single_threaded_blas
from orchestrator.recall.result import FactRef, Provenance, ScopeRef, SourceRef
from orchestrator.recall.tail import (
    CLAIMS,
    Candidate,
    assign_merit,
    drop_redundant_derived,
    order,
    suppress_duplicates,
)

WORDS = ["boiler", "garden", "recipe", "meeting", "budget", "release", "archive", "scheduler",
         "painting", "support", "group", "concert", "hiking", "school", "adoption", "camping",
         "pottery"]


NAMES = [f"Person{i} Name{i}" for i in range(40)]


def passage(rng: np.random.Generator) -> tuple[str, str]:
    """(its speaker, the passage): a speaker's line naming one more person."""
    who = NAMES[int(rng.integers(len(NAMES)))]
    body = " ".join(rng.choice(WORDS, size=18))
    return who, f"{who}: {body} with {NAMES[int(rng.integers(len(NAMES)))]}."


def corpus(size: int, rng: np.random.Generator) -> list[tuple[str, str]]:
    """A tenant's passages: a recall's pool is drawn from them, so whole texts recur across
    recalls as they do in use (the tokenizers' caches then hit); size 0: every text is new."""
    return [passage(rng) for _ in range(size)]


def pool(n: int, rng: np.random.Generator, texts: list[tuple[str, str]] | None = None
         ) -> tuple[list[Candidate], RankContext]:
    scope = (ScopeRef("team", ""),)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    docs = [uuid.uuid4() for _ in range(n // 3)]
    out: list[Candidate] = []
    for i in range(n):
        v = rng.normal(size=384).astype(np.float32)
        who, text = texts[int(rng.integers(len(texts)))] if texts else passage(rng)
        lanes: dict[str, Any] = {"dense_rank": i + 1, "dense_distance": 0.2 + i / (2 * n)}
        if i % 2:
            lanes.update(lexical_rank=i // 2 + 1, bm25=10.0 - i / n)
        if i % 6 == 5:
            fact = FactRef(subject=who, predicate="co_mentioned_with", object=NAMES[(i * 7) % 40],
                           epistemic_kind="world_fact", perspective_key="world",
                           author_role="extractor")
            out.append(Candidate(key=f"{CLAIMS}:{i}", kind="fact", text=text, scopes=scope,
                                 provenance=Provenance.DERIVED_MEMORY, item_table=CLAIMS,
                                 item_id=uuid.uuid4(), fact=fact, embedding=v, author="extractor",
                                 lanes={"facts_rank": i // 6 + 1}, rrf=1.0 / (10 + i)))
            continue
        out.append(Candidate(key=f"chunk:{i}", kind="source", text=text, scopes=scope,
                             source=SourceRef("c", f"D{i}", f"D{i}"), document_id=docs[i % len(docs)],
                             item_table="sources.chunks", item_id=uuid.uuid4(), char_start=0,
                             embedding=v, author=who.split()[0], lanes=lanes,
                             occurred_at=start + timedelta(minutes=i), rrf=1.0 / (10 + i)))
    q = rng.normal(size=384).astype(np.float32)
    return out, RankContext("When did Person3 go to the pottery group with Person7?",
                            None, q, [NAMES[3], NAMES[7], NAMES[11], NAMES[19]])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--candidates", type=int, default=200)
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--corpus", type=int, default=2000,
                    help="passages the pools are drawn from (0: every text new, no cache hits)")
    args = ap.parse_args()
    model = default_model()
    if not isinstance(model, RankModel):
        raise SystemExit(f"no model to time: {model}")
    rng = np.random.default_rng(11)
    texts = corpus(args.corpus, rng)
    fused_ms: list[float] = []
    learned_ms: list[float] = []
    fused_cpu: list[float] = []
    learned_cpu: list[float] = []
    stages: dict[str, list[float]] = {"ppr": [], "features": [], "predict": [], "mmr": []}
    for _ in range(args.runs):
        cands, ctx = pool(args.candidates, rng, texts)
        t0, c0 = time.perf_counter(), time.process_time()
        with single_threaded_blas():
            assign_merit(cands, 0.3)
            suppress_duplicates(order(cands), 0.95)
        fused_ms.append((time.perf_counter() - t0) * 1000)
        fused_cpu.append((time.process_time() - c0) * 1000)
        cands, ctx = pool(args.candidates, rng, texts)
        t0, c0 = time.perf_counter(), time.process_time()
        with single_threaded_blas():
            report = apply_learned(cands, ctx, model)
            assign_merit(cands, 0.3)
            kept, _ = suppress_duplicates(order(cands), 0.95)
            kept, _ = drop_redundant_derived(kept)
            t1 = time.perf_counter()
            diversify(kept, 0.85, 3, 60)
        t2 = time.perf_counter()
        learned_ms.append((t2 - t0) * 1000)
        learned_cpu.append((time.process_time() - c0) * 1000)
        for k, v in (report.timings_ms or {}).items():
            stages[k].append(v)
        stages["mmr"].append((t2 - t1) * 1000)

    def p(values: list[float], q: float) -> float:
        return float(np.percentile(values, q))

    print(f"{args.candidates} candidates drawn from {args.corpus or 'fresh'} passages, {args.runs} runs "
          f"each; model {model.label}")
    print(f"fused tail (merit, order, duplicates):            p50 {p(fused_ms, 50):6.2f} ms  "
          f"p95 {p(fused_ms, 95):6.2f} ms")
    print(f"learned tail (+ PPR, features, predict, MMR):     p50 {p(learned_ms, 50):6.2f} ms  "
          f"p95 {p(learned_ms, 95):6.2f} ms   ratio p50 {p(learned_ms, 50) / p(fused_ms, 50):.1f}x")
    print("stages p50: " + ", ".join(f"{k} {p(v, 50):.2f} ms" for k, v in stages.items()))
    print(f"CPU time: fused tail p50 {p(fused_cpu, 50):.2f} ms, learned tail p50 "
          f"{p(learned_cpu, 50):.2f} ms (wall time counts waiting for a shared CPU, CPU time not)")
    extra = [a - b for a, b in zip(learned_ms, fused_ms, strict=True)]
    extra_cpu = [a - b for a, b in zip(learned_cpu, fused_cpu, strict=True)]
    print(f"ranker + PPR + MMR (learned minus fused tail):    p50 {p(extra, 50):6.2f} ms wall, "
          f"{p(extra_cpu, 50):.2f} ms CPU (goal <= 10 ms)")
    started = time.process_time()
    sum(range(10**6))
    print(f"reference: sum(range(10**6)) took {(time.process_time() - started) * 1000:.1f} ms CPU "
          "here (about 15 ms on an idle core of this class)")


if __name__ == "__main__":
    main()
