"""Derive benchmark: time per derive job at N chunks, and RAPTOR's incremental cost vs a full rebuild.

For each size in ``--chunks`` (default 10000 and 100000) starts a throwaway
embedded PostgreSQL (``orchestrator.db.scratch``), fills a tenant with
**synthetic** data, then times each job in its own transaction as the app role:

* chunks: documents of ``--chunks-per-doc`` chunks, each chunk 4 to 6 generated
  sentences about one of ``chunks / 40`` topics (one names a person, a city and a
  date: "<Person> <verb> the <noun> <noun> near <City> on <date>."; the others are
  topic prose), about 400 characters; their embeddings are **synthetic vectors**
  (a random centre per topic plus noise, 384-d, unit length), written as if the
  worker had embedded them. No model runs, so the figures are the jobs' own cost,
  not embedding.
* claims written by the caller (bring-your-own triples): ``--claims-per-chunk``
  world-fact relations between people of the same topic (so the graph has
  communities) and notes about them (so people have profiles); their fact
  contents get synthetic vectors too (they join the RAPTOR tree);
* working-memory items of the benchmark user (``--items-per-chunk``), every
  fifth marked as a decision, for the episode and decision jobs.

Jobs timed: extract (spaCy over at most ``--extract-chunks`` chunks: the figure
is per that many, printed with its rate), communities, profiles, raptor (first
build), and, when ``orchestrator.derive.jobs`` has them, conflicts, consolidate,
episodes and decisions. Then RAPTOR again with nothing changed (the idempotent
run), RAPTOR after adding ``--increment`` (default 1%) new chunks in new
documents (half near existing topics, half in new ones), and a full rebuild of
the same data; the ratio incremental / full is the figure to watch (goal: at
most 0.1x). RAPTOR lines end with the report's seconds per phase; ``--skip raptor``
leaves all four RAPTOR runs out (e.g. to time extraction alone). The extract line
counts the relation and date claims among its claims. Communities
get the same treatment: a rerun with nothing changed, a rerun after ``--increment``
more claims (half of them relations, so the graph changes), and a full rebuild
(``rebuild(full=True)``) of the same graph, with their ratio. Those lines give wall
time and, beside it, CPU time of this process and its database backend together
(read from ``/proc``, the scratch server runs here): on a machine shared with other
work the wall-clock ratio moves with the load, the CPU ratio much less. Usage::

    .venv/bin/python benchmarks/derive.py [--chunks 10000 100000] [--extract-chunks 500] \\
        [--claims-per-chunk 0.1] [--items-per-chunk 0.01] [--increment 0.01] [--skip JOB ...]
"""

from __future__ import annotations

import argparse
import importlib
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from sqlalchemy import Engine, create_engine, insert, text

from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.knowledge_models import WorkingMemoryItem
from orchestrator.db.models import EMBEDDING_DIMENSION, Chunk, Document
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session
from orchestrator.ingest.knowledge import FactInput, assert_fact, assert_relation, resolve_entity

FIRST = ["Ada", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemal",
         "Lucia", "Mateo", "Nadia", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tara"]
LAST = ["Lovelace", "Okafor", "Moreau", "Ivanov", "Santos", "Haddad", "Hopper", "Tanaka", "Silva",
        "Berg", "Yilmaz", "Romano", "Alvarez", "Petrova", "Lind", "Sharma", "Dubois", "Costa"]
CITIES = ["Lisbon", "Oslo", "Nairobi", "Kyoto", "Lima", "Porto", "Dublin", "Seville", "Hanoi", "Quito",
          "Tallinn", "Accra", "Perth", "Bergen", "Malaga", "Krakow"]
VERBS = ["reviewed", "shipped", "planned", "measured", "repaired", "documented", "tested", "presented",
         "funded", "audited", "redesigned", "inspected"]
MONTHS = ["January", "March", "May", "July", "September", "November"]
SYLLABLES = ["ka", "lo", "mi", "ren", "to", "vas", "qui", "zel", "dor", "pha", "nu", "sel", "tri", "bo",
             "gan", "wex"]


@dataclass
class Corpus:
    rng: np.random.Generator
    topics: int
    centres: np.ndarray
    nouns: list[list[str]]
    people: list[str]


def _word(rng: np.random.Generator) -> str:
    return "".join(rng.choice(SYLLABLES, size=int(rng.integers(2, 4))))


def _corpus(chunks: int, seed: int) -> Corpus:
    rng = np.random.default_rng(seed)
    topics = max(4, chunks // 40)
    centres = rng.normal(size=(topics * 2, EMBEDDING_DIMENSION))  # half held back for "new" topics
    nouns = [[_word(rng) for _ in range(8)] for _ in range(topics * 2)]
    people = [f"{FIRST[i % len(FIRST)]} {LAST[(i // len(FIRST)) % len(LAST)]} {_word(rng).title()}"
              for i in range(max(20, chunks // 20))]
    return Corpus(rng, topics, centres, nouns, people)


def _chunk(c: Corpus, topic: int) -> tuple[str, list[float]]:
    r = c.rng
    nouns = c.nouns[topic]
    # One sentence names a person, a place and a date (what extraction finds); the rest is topic prose.
    person = c.people[(topic + len(c.people) // c.topics * int(r.integers(0, 3))) % len(c.people)]
    when = f"{int(r.integers(1, 28))} {r.choice(MONTHS)} {int(r.integers(2019, 2026))}"
    sentences = [f"{person} {r.choice(VERBS)} the {r.choice(nouns)} {r.choice(nouns)} near "
                 f"{r.choice(CITIES)} on {when}."]
    for _ in range(int(r.integers(3, 6))):
        sentences.append(f"The {r.choice(nouns)} {r.choice(nouns)} was {r.choice(VERBS)} again, and the "
                         f"{r.choice(nouns)} team kept notes on its {r.choice(nouns)}.")
    vec = c.centres[topic] + 0.9 * r.normal(size=EMBEDDING_DIMENSION)
    vec /= np.linalg.norm(vec)
    return " ".join(sentences), vec.tolist()


def _vector_text(v: list[float]) -> str:
    return "[" + ",".join(f"{x:.6f}" for x in v) + "]"


def _tenant(admin: Engine) -> str:
    org = f"bench-derive-{uuid.uuid4().hex[:8]}"
    with admin.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        conn.execute(text("select auth.create_scope(:t, 'team', 'bench')"), {"t": tid})
    return org


def _write_chunks(app: Engine, ident: Identity, c: Corpus, n: int, per_doc: int, prefix: str,
                  topics: Callable[[int], int]) -> None:
    """``n`` chunks in documents of ``per_doc``; embeddings written as the worker would."""
    for start in range(0, n, 2000):
        with bound_session(app, ident) as s:
            scope = s.execute(text("select id from auth.scopes where name = 'team'")).scalar_one()
            rows: list[tuple[int, str, list[float]]] = []
            for i in range(start, min(n, start + 2000)):
                topic = topics(i)
                body, vec = _chunk(c, topic)
                rows.append((i, body, vec))
            docs = {}
            for d in range(start // per_doc, (min(n, start + 2000) - 1) // per_doc + 1):
                members = [r for r in rows if r[0] // per_doc == d]
                docs[d] = s.execute(insert(Document).values(
                    collection="bench", path=f"{prefix}{d}.md", title=f"{prefix} {d}",
                    body="\n\n".join(m[1] for m in members), scopes=[scope]
                ).returning(Document.id)).scalar_one()
            ids = s.execute(insert(Chunk).returning(Chunk.id, sort_by_parameter_order=True), [
                {"document_id": docs[i // per_doc], "ordinal": i % per_doc, "text": body, "char_start": 0,
                 "char_end": len(body)} for i, body, _ in rows]).scalars().all()
            s.execute(text(
                "update sources.chunks c set embedding = cast(v.e as vector), embed_state = 'ready', "
                "embed_model = 'synthetic', embedded_at = now() "
                "from unnest(cast(:ids as uuid[]), cast(:vecs as text[])) as v(id, e) where c.id = v.id"),
                {"ids": list(ids), "vecs": [_vector_text(v) for _, _, v in rows]})


def _write_claims(app: Engine, admin: Engine, ident: Identity, c: Corpus, n: int, org: str,
                  start: int = 0) -> int:
    """Claims ``start`` to ``start + n`` (the same ``i`` always makes the same claim)."""
    written = 0
    people_per_topic = max(2, len(c.people) // c.topics)
    with bound_session(app, ident) as s:
        ids = {}
        for name in c.people:
            found = resolve_entity(s, "person", name, ("team",))
            assert found is not None
            ids[name] = found
    for first in range(start, start + n, 500):
        with bound_session(app, ident) as s:
            for i in range(first, min(start + n, first + 500)):
                topic = i % c.topics
                a = c.people[(topic * people_per_topic + i) % len(c.people)]
                b = c.people[(topic * people_per_topic + i // 3 + 1) % len(c.people)]
                noun = c.nouns[topic][i % len(c.nouns[topic])]
                if i % 2 and a != b:
                    assert_relation(s, ids[a], "works_with", ids[b], f"{a} works with {b} on the {noun}.",
                                    ("team",))
                else:
                    assert_fact(s, FactInput(subject_id=ids[a], predicate="note", scopes=("team",),
                                             text=f"{a} leads the {noun} work in {CITIES[i % len(CITIES)]}.",
                                             value=noun))
                written += 1
    # The worker would embed the new fact contents; synthetic vectors near their topic stand in.
    with admin.begin() as conn:
        tid = conn.execute(text("select id from auth.tenants where org_id = :o"), {"o": org}).scalar_one()
        pending = conn.execute(text("select id from knowledge.fact_content where tenant_id = :t "
                                    "and embed_state = 'pending'"), {"t": tid}).scalars().all()
        vecs = []
        for i in range(len(pending)):
            v = c.centres[i % c.topics] + 0.9 * c.rng.normal(size=EMBEDDING_DIMENSION)
            vecs.append(_vector_text((v / np.linalg.norm(v)).tolist()))
        conn.execute(text(
            "update knowledge.fact_content f set embedding = cast(v.e as vector), embed_state = 'ready', "
            "embed_model = 'synthetic', embedded_at = now() "
            "from unnest(cast(:ids as uuid[]), cast(:vecs as text[])) as v(id, e) "
            "where f.tenant_id = :t and f.id = v.id"), {"ids": list(pending), "vecs": vecs, "t": tid})
    return written


def _write_items(app: Engine, ident: Identity, c: Corpus, n: int) -> None:
    with bound_session(app, ident) as s:
        scope = s.execute(text("select id from auth.scopes where name = 'team'")).scalar_one()
        for i in range(n):
            decision = i % 5 == 4
            noun = c.nouns[i % c.topics][0]
            s.execute(insert(WorkingMemoryItem).values(
                session_id=f"s{i // 10}", scopes=[scope], kind="decision" if decision else "note",
                text=(f"We decided to ship the {noun} plan because the review passed." if decision
                      else f"Note {i}: the {noun} review is on track.")))


def _timed(app: Engine, ident: Identity, job: Callable[[Any], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    with bound_session(app, ident) as s:
        result = job(s)
    return time.perf_counter() - start, result


@dataclass
class Cost:
    wall: float
    cpu: float | None  # this process and its database backend; None when the backend is not local

    def __str__(self) -> str:
        return f"{self.wall:8.2f} s" + (f" (cpu {self.cpu:6.2f} s)" if self.cpu is not None else "")


def _backend_cpu(session: Any) -> float | None:
    """CPU seconds the session's server process has used (Linux, server on this machine)."""
    pid = session.execute(text("select pg_backend_pid()")).scalar_one()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured(app: Engine, ident: Identity, job: Callable[[Any], Any]) -> tuple[Cost, Any]:
    """Wall time, and CPU time of client and server together: on a machine shared with other
    work the wall-clock ratio moves with the load, the CPU ratio much less."""
    start = time.perf_counter()
    with bound_session(app, ident) as s:
        server, client = _backend_cpu(s), time.process_time()
        result = job(s)
        after = _backend_cpu(s)
        cpu = None if server is None or after is None else time.process_time() - client + after - server
    return Cost(time.perf_counter() - start, cpu), result


def _ratio(incremental: Cost, full: Cost) -> str:
    cpu = (f", cpu {incremental.cpu / full.cpu:.3f}x" if incremental.cpu is not None and full.cpu
           else "")
    return f"{incremental.wall / full.wall:.3f}x{cpu}"


def _raptor_line(r: Any) -> str:
    phases = " ".join(f"{k} {v:.1f}" for k, v in getattr(r, "seconds", {}).items())
    return (f"{r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, {r.unchanged} unchanged, "
            f"{r.resummarised} summarised, {r.joined} joined, {r.levels} levels [s: {phases}]")


def _communities_line(r: Any) -> str:
    levels = " ".join(f"L{lv}:{c.inserted + c.updated + c.unchanged + c.relinked}"
                      for lv, c in sorted(r.levels.items()))
    return (f"{r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, {r.unchanged} unchanged, "
            f"{r.resummarised} summarised [{levels}]")


def run_size(app: Engine, admin: Engine, settings: Settings, args: argparse.Namespace, n: int) -> None:
    from orchestrator.derive import communities, extract, profiles, raptor

    org = _tenant(admin)
    ident = Identity.of(org, "bench", read=("team",), write=("team",))
    c = _corpus(n, args.seed)
    t0 = time.perf_counter()
    _write_chunks(app, ident, c, n, args.chunks_per_doc, "doc", lambda i: i % c.topics)
    claims = _write_claims(app, admin, ident, c, int(n * args.claims_per_chunk), org)
    items = int(n * args.items_per_chunk)
    _write_items(app, ident, c, items)
    print(f"\n== {n} chunks ({c.topics} topics, {claims} claims, {items} working-memory items; "
          f"synthetic text and vectors; setup {time.perf_counter() - t0:.1f} s; "
          f"load average {os.getloadavg()[0]:.1f})")

    jobs: list[tuple[str, Callable[[Any], Any], Callable[[Any], str]]] = []
    if "extract" not in args.skip:
        jobs.append(("extract", lambda s: extract.extract(s, limit=args.extract_chunks),
                     lambda r: f"{r.chunks} chunks read, {len(r.claims)} claims, "
                               f"{getattr(r, 'relations', '-')} relations, {getattr(r, 'dates', '-')} dates"))
    try:
        registry: Any = importlib.import_module("orchestrator.derive.jobs").JOBS_BY_NAME
    except (ImportError, AttributeError):
        registry = {}
    for name in ("conflicts", "consolidate", "episodes", "decisions"):
        if name in registry and name not in args.skip:
            jobs.append((name, lambda s, j=registry[name]: j.run(s, settings), lambda r: str(r.line)))
        elif name not in args.skip:
            print(f"  {name:<22} not present (orchestrator.derive.jobs has no such job)")
    if "communities" not in args.skip:
        jobs.append(("communities", lambda s: communities.rebuild(s, settings=settings), _communities_line))
    if "profiles" not in args.skip:
        jobs.append(("profiles", lambda s: profiles.refresh(s, settings=settings),
                     lambda r: f"{r.inserted} inserted"))
    for name, job, line in jobs:
        try:
            seconds, result = _timed(app, ident, job)
            extra = f" ({result.chunks / seconds:.0f} chunks/s)" if name == "extract" and seconds else ""
            print(f"  {name:<22} {seconds:8.2f} s  {line(result)}{extra}")
        except Exception as exc:  # one job failing must not hide the others' figures
            print(f"  {name:<22}   failed: {type(exc).__name__}: {exc}")

    if "communities" not in args.skip:
        # Louvain reruns over the whole graph either way; the incremental run saves the
        # summaries and writes of the communities whose members and input did not change.
        cost, r = _measured(app, ident, lambda s: communities.rebuild(s, settings=settings))
        print(f"  {'communities (no change)':<22} {cost}  {_communities_line(r)}")
        more = max(1, int(claims * args.increment))
        _write_claims(app, admin, ident, c, more, org, start=claims)
        step, r = _measured(app, ident, lambda s: communities.rebuild(s, settings=settings))
        label = f"communities (+{more} claims)"
        print(f"  {label:<22} {step}  {_communities_line(r)}")
        whole, r = _measured(app, ident, lambda s: communities.rebuild(s, full=True, settings=settings))
        print(f"  {'communities (full)':<22} {whole}  {_communities_line(r)}")
        print(f"  communities incremental / full = {_ratio(step, whole)}")

    if "raptor" in args.skip:
        return
    build: Callable[..., Any] = raptor.build
    cost, r = _measured(app, ident, lambda s: build(s, settings=settings))
    print(f"  {'raptor (first build)':<22} {cost}  {_raptor_line(r)}")
    cost, r = _measured(app, ident, lambda s: build(s, settings=settings))
    print(f"  {'raptor (no change)':<22} {cost}  {_raptor_line(r)}")
    added = max(1, int(n * args.increment))
    _write_chunks(app, ident, c, added, args.chunks_per_doc, "new",
                  lambda i: i % c.topics if i % 2 == 0 else c.topics + i % c.topics)
    incremental, r = _measured(app, ident, lambda s: build(s, settings=settings))
    print(f"  {'raptor (+' + str(added) + ' chunks)':<22} {incremental}  {_raptor_line(r)}")
    full, r = _measured(app, ident, lambda s: build(s, full=True, settings=settings))
    print(f"  {'raptor (full rebuild)':<22} {full}  {_raptor_line(r)}")
    print(f"  incremental / full = {_ratio(incremental, full)} (goal <= 0.1x); "
          f"load average {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks", type=int, nargs="+", default=[10_000, 100_000], help="sizes to run")
    ap.add_argument("--chunks-per-doc", type=int, default=10)
    ap.add_argument("--extract-chunks", type=int, default=500, help="chunks the extract job reads")
    ap.add_argument("--claims-per-chunk", type=float, default=0.1)
    ap.add_argument("--items-per-chunk", type=float, default=0.01)
    ap.add_argument("--increment", type=float, default=0.01, help="new content for the incremental run")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--skip", nargs="*", default=[], help="jobs not to run (e.g. extract consolidate)")
    args = ap.parse_args()

    settings = Settings()
    print(f"derive benchmark: raptor cluster size {settings.raptor_cluster_size} "
          f"(max {settings.raptor_max_cluster_size}), join distance {settings.raptor_join_distance}, "
          f"summaries {settings.summary_endpoint_model or 'extractive'}")
    for n in args.chunks:
        # A fresh database per size: in a shared one, statistics gathered while an earlier
        # tenant was alone mislead provenance.row_version's plan for the next tenant's rows.
        with scratch_database() as db:
            admin = create_engine(db.admin_url())
            app = make_app_engine(db.app_url(), pool_size=2)
            try:
                run_size(app, admin, settings, args, n)
            finally:
                admin.dispose()
                app.dispose()


if __name__ == "__main__":
    main()
