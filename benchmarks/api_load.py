"""API load benchmark: concurrent GraphQL clients issuing recall and writes over real HTTP.

Starts its own embedded PostgreSQL in a temporary home, migrates it, makes a
tenant and a development key, then runs the real processes a deployment runs:
``engram serve`` (the API, its operation thread pool sized to the largest client
count) and ``engram worker run`` (the embedding worker, so written chunks get
vectors and recall's dense lane has something to find). The clients run in this
process on one asyncio loop (httpx.AsyncClient, one connection each), so client
and server never share a GIL and no thread limiter caps the concurrency.

The server is used once ``/readyz`` says ready (models loaded and warmed). A
seeded corpus is written through GraphQL and embedded, then 100 recalls run one
after another: the first one after ready is printed beside the 100th and the
median (readiness means the first recall costs what the others do), and beside
the median of recalls 2-8, the other questions asked for the first time (their
embedding not cached yet; later recalls repeat them). Then,
for each client count (``--clients 1,4,16,64``), that many clients each
loop for ``--seconds`` (60) issuing, in turn, a ``recall`` and an
``upsertDocument`` of a new document (``--write-every`` sets the mix), each
client with its own token for its own user. Reported per client count:
requests/s, p50/p95/p99 latency per operation, and failures of every kind
(non-200 answers, bodies that are not JSON, GraphQL errors, transport errors and
timeouts), which must be zero; and how many written chunks still wait for their
embedding when the run ends.

Afterwards every write is counted back (documents in the database must equal
the seed plus the acknowledged upserts: no write lost or doubled) and the
tenant's provenance chain is verified as ``engram_auditor``. The exit status is
1 when any request failed, a write is missing, or the chain does not verify.
Usage::

    .venv/bin/python benchmarks/api_load.py [--clients 1,4,16,64] [--seconds 60] [--seed-docs 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import create_engine, pool, text

from orchestrator.admin import create_scope, create_tenant
from orchestrator.audit import chain
from orchestrator.auth.devkey import create_dev_key, key_path, mint_token
from orchestrator.config import Settings
from orchestrator.db.scratch import scratch_database
from orchestrator.db.server import free_port

RECALL = "query($q: String!) { recall(question: $q, budgetTokens: 800) { usedTokens evidence { kind } } }"
UPSERT = """mutation($p: String!, $b: String!) { upsertDocument(input: {collection: "load",
  path: $p, title: $p, body: $b, scopes: ["team"]}) { created } }"""
TOPICS = ("rivers", "bridges", "orchards", "glaciers", "harbours", "libraries", "comets", "mills")
ENGRAM = str(Path(sys.executable).with_name("engram"))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Run:
    latency: dict[str, list[float]] = field(default_factory=lambda: {"recall": [], "write": []})
    failures: dict[str, int] = field(default_factory=dict)
    examples: list[str] = field(default_factory=list)
    acknowledged: int = 0

    def fail(self, kind: str, detail: str) -> None:
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if len(self.examples) < 3:
            self.examples.append(f"{kind}: {detail[:300]}")

    @property
    def errors(self) -> int:
        return sum(self.failures.values())


def check(run: Run, op: str, response: httpx.Response) -> bool:
    """Whether the answer is a success; any other answer is counted as a failure of its kind."""
    if response.status_code != 200:
        run.fail(f"HTTP {response.status_code}", response.text)
        return False
    try:
        body: Any = response.json()
    except ValueError:
        run.fail("not JSON", response.text)
        return False
    if not isinstance(body, dict) or body.get("errors") or not isinstance(body.get("data"), dict):
        run.fail("GraphQL error", str(body))
        return False
    if op == "write" and body["data"].get("upsertDocument", {}).get("created") is not True:
        run.fail("write not created", str(body))
        return False
    return True


async def client(k: int, n: int, url: str, token: str, run: Run, stop_at: float,
                 write_every: int) -> None:
    i = 0
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}, timeout=120,
                                 limits=httpx.Limits(max_connections=1)) as http:
        while time.monotonic() < stop_at:
            op = "write" if i % write_every == 0 else "recall"
            body = ({"query": UPSERT, "variables": {"p": f"run{n}/{k}/{i}.md",
                                                    "b": f"Client {k} wrote note {i} about "
                                                         f"{TOPICS[i % len(TOPICS)]}. " * 10}}
                    if op == "write" else
                    {"query": RECALL, "variables": {
                        "q": f"What do the notes say about {TOPICS[(i + k) % len(TOPICS)]}?"}})
            t0 = time.perf_counter()
            try:
                response = await http.post(url, json=body)
                ok = check(run, op, response)
            except Exception as exc:  # every failure is counted; none ends a client
                run.fail(type(exc).__name__, str(exc))
                ok = False
            run.latency[op].append((time.perf_counter() - t0) * 1000)
            if ok and op == "write":
                run.acknowledged += 1
            i += 1


async def load(n: int, url: str, tokens: list[str], seconds: float, write_every: int) -> tuple[Run, float]:
    run = Run()
    stop_at = time.monotonic() + seconds
    t0 = time.monotonic()
    await asyncio.gather(*(client(k, n, url, tokens[k], run, stop_at, write_every) for k in range(n)))
    return run, time.monotonic() - t0


def first_and_hundredth(url: str, token: str) -> None:
    """The first recall the server answers after /readyz said ready, beside the 100th and the
    median of recalls 2-100 (one client, one at a time): readiness means the first one is not
    the one that loads the models."""
    ms: list[float] = []
    with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=300) as c:
        for i in range(100):
            topic = TOPICS[i % len(TOPICS)]
            body = {"query": RECALL, "variables": {"q": f"What do the notes say about {topic}?"}}
            t0 = time.perf_counter()
            r = c.post(url, json=body)
            ms.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200 and "errors" not in r.json(), r.text
    rest = ms[1:]
    # Questions repeat every len(TOPICS) recalls, and a repeated question's embedding is cached:
    # recalls 2..len(TOPICS) are new questions like the first, so they show what is cold start
    # and what is the embedding.
    new = ms[1:len(TOPICS)]
    print(f"first recall after ready: {ms[0]:.0f} ms; 100th {ms[-1]:.0f} ms; median of 2-100 "
          f"{percentile(rest, 0.5):.0f} ms; first / median {ms[0] / percentile(rest, 0.5):.2f}x "
          f"(goal <= 2x); recalls 2-{len(TOPICS)} (new questions, embedding not cached yet) median "
          f"{percentile(new, 0.5):.0f} ms, first / that {ms[0] / percentile(new, 0.5):.2f}x")


def env_for(settings: Settings, threads: int) -> dict[str, str]:
    env = {**os.environ, "ENGRAM_HOME": str(settings.home), "ENGRAM_DB_PORT": str(settings.db_port),
           "ENGRAM_DB_NAME": settings.db_name, "ENGRAM_AUTH_DEV_KEY_PATH": str(key_path(settings)),
           "ENGRAM_AUTH_TRUST_DEV_KEY": "true", "ENGRAM_API_THREADS": str(threads),
           "ENGRAM_DERIVE_INTERVAL_S": "0"}
    env.pop("ENGRAM_WORKER_URL", None)
    return env


def pending_chunks(admin_url: str, tenant: uuid.UUID) -> tuple[int, int]:
    with create_engine(admin_url, poolclass=pool.NullPool).connect() as conn:
        row = conn.execute(text("select count(*) filter (where embed_state = 'pending'), count(*) "
                                "from sources.chunks where tenant_id = :t"), {"t": tenant}).one()
    return int(row[0]), int(row[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16,64", help="client counts, comma separated")
    ap.add_argument("--seconds", "--duration", type=float, default=60.0, help="duration per client count")
    ap.add_argument("--seed-docs", type=int, default=200, help="documents written before the run")
    ap.add_argument("--write-every", type=int, default=2, help="every n-th request is a write")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]
    if not counts or min(counts) < 1 or args.write_every < 1:
        ap.error("--clients takes positive counts and --write-every a positive number")

    failed = False
    with scratch_database(auth_trust_dev_key=True) as db:
        settings = db.settings
        org = f"bench-{uuid.uuid4().hex[:8]}"
        tenant = create_tenant(db, org, org)
        create_scope(db, org, "team", "Load test scope")
        create_dev_key(settings)
        env = env_for(settings, max(counts))
        port = free_port()
        url = f"http://127.0.0.1:{port}/graphql"
        # --no-extract: the write path measured here, not extraction (which the worker would
        # run on every written document).
        worker = subprocess.Popen([ENGRAM, "worker", "run", "--no-derive", "--no-extract"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        server = subprocess.Popen([ENGRAM, "serve", "--port", str(port)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 300
            started = time.monotonic()
            while True:
                # Ready: the models are loaded and every recall stage has run once.
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    said = server.stderr.read() if server.stderr else ""
                    sys.exit(f"engram serve did not get ready: {said}")
                time.sleep(0.2)
            print(f"ready: /readyz answered 200 {time.monotonic() - started:.1f} s after start")
            seeder = mint_token(settings, tenant=org, user="seeder", scopes=["write:team"], ttl_s=86_400)
            with httpx.Client(headers={"authorization": f"Bearer {seeder}"}, timeout=120) as c:
                for i in range(args.seed_docs):
                    topic = TOPICS[i % len(TOPICS)]
                    r = c.post(url, json={"query": UPSERT, "variables": {
                        "p": f"seed/{i}.md", "b": f"Notes on {topic} number {i}. " * 20}})
                    assert r.status_code == 200 and "errors" not in r.json(), r.text
            t0 = time.monotonic()
            while (waiting := pending_chunks(db.admin_url(), tenant))[0] and time.monotonic() - t0 < 600:
                time.sleep(0.5)
            print(f"seed: {args.seed_docs} documents, {waiting[1]} chunks, embedded by the worker in "
                  f"{time.monotonic() - t0:.1f} s ({waiting[0]} still pending)")
            first_and_hundredth(url, seeder)
            print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs visible; "
                  f"server, worker, PostgreSQL and clients share them")
            tokens = [mint_token(settings, tenant=org, user=f"bench-{k}", scopes=["write:team"],
                                 ttl_s=86_400) for k in range(max(counts))]
            acknowledged = 0
            print(f"{'clients':>7} {'req/s':>7} {'recalls':>7} {'writes':>6} "
                  f"{'recall p50/p95/p99 ms':>22} {'write p50/p95/p99 ms':>21} {'errors':>6} "
                  f"{'unembedded':>10}")
            for n in counts:
                run, wall = asyncio.run(load(n, url, tokens, args.seconds, args.write_every))
                acknowledged += run.acknowledged
                total = len(run.latency["recall"]) + len(run.latency["write"])
                fmt = lambda v: "/".join(f"{percentile(v, q):.0f}" for q in (0.5, 0.95, 0.99))  # noqa: E731
                pending, _ = pending_chunks(db.admin_url(), tenant)
                print(f"{n:>7} {total / wall:>7.1f} {len(run.latency['recall']):>7} "
                      f"{len(run.latency['write']):>6} {fmt(run.latency['recall']):>22} "
                      f"{fmt(run.latency['write']):>21} {run.errors:>6} {pending:>10}", flush=True)
                if run.errors:
                    failed = True
                    print(f"  failures: {run.failures}")
                    for example in run.examples:
                        print(f"    {example}")
        finally:
            for proc in (server, worker):
                proc.terminate()
            for proc in (server, worker):
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
        with create_engine(db.admin_url(), poolclass=pool.NullPool).connect() as conn:
            stored = int(conn.execute(text("select count(*) from sources.documents where tenant_id = :t"),
                                      {"t": tenant}).scalar_one())
        expected = args.seed_docs + acknowledged
        print(f"documents: {stored} stored, {expected} acknowledged (seed {args.seed_docs})")
        if stored != expected:
            failed = True
            print("  writes lost or duplicated")
        auditor = create_engine(db.role_url("engram_auditor"), poolclass=pool.NullPool)
        with auditor.connect() as conn:
            reports = chain.verify(conn, tenant)
        ok = bool(reports) and all(r.ok for r in reports)
        print(f"provenance chain: {'verifies' if ok else 'BROKEN'} "
              f"({sum(r.checked for r in reports)} events)")
        auditor.dispose()
        failed = failed or not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
