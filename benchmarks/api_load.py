"""API load benchmark: concurrent GraphQL clients issuing recall and writes over real HTTP.

Starts its own embedded PostgreSQL in a temporary home, migrates it, makes a
tenant with a seeded corpus, a development key, and serves the real app under
uvicorn on a free port. Then, for each client count (``--clients 1,4,16,64``),
that many threads each loop for ``--seconds`` (60) issuing, in turn, a
``recall`` and an ``upsertDocument`` of a new document (``--write-every``
sets the mix), each with its own verified token. Reported per client count:
requests/s, p50/p95/p99 latency per operation, and errors (must be zero).

Afterwards every write is counted back (documents in the database must equal
the seed plus the acknowledged upserts: no write lost) and the tenant's
provenance chain is verified as ``engram_auditor``. The exit status is 1 when
any error occurred, a write is missing, or the chain does not verify. Usage::

    .venv/bin/python benchmarks/api_load.py [--clients 1,4,16,64] [--seconds 60] [--seed-docs 200]
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid

import httpx
import uvicorn
from sqlalchemy import create_engine, pool, text

from orchestrator.admin import create_scope, create_tenant
from orchestrator.api.app import create_app
from orchestrator.audit import chain
from orchestrator.auth.devkey import create_dev_key, mint_token
from orchestrator.db.engine import make_app_engine
from orchestrator.db.scratch import scratch_database
from orchestrator.db.server import free_port

RECALL = "query($q: String!) { recall(question: $q, budgetTokens: 800) { usedTokens } }"
UPSERT = """mutation($p: String!, $b: String!) { upsertDocument(input: {collection: "load",
  path: $p, title: $p, body: $b, scopes: ["team"]}) { created } }"""
TOPICS = ("rivers", "bridges", "orchards", "glaciers", "harbours", "libraries", "comets", "mills")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16,64", help="client counts, comma separated")
    ap.add_argument("--seconds", type=float, default=60.0, help="duration per client count")
    ap.add_argument("--seed-docs", type=int, default=200, help="documents written before the run")
    ap.add_argument("--write-every", type=int, default=2, help="every n-th request is a write")
    args = ap.parse_args()
    counts = [int(c) for c in args.clients.split(",") if c.strip()]

    failed = False
    with scratch_database(auth_trust_dev_key=True) as db:
        settings = db.settings
        org = f"bench-{uuid.uuid4().hex[:8]}"
        tenant = create_tenant(db, org, org)
        create_scope(db, org, "team", "Load test scope")
        create_dev_key(settings)
        engine = make_app_engine(db.app_url(), pool_size=max(counts) + 4)
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(settings, engine), host="127.0.0.1",
                                               port=port, log_level="warning", lifespan="off"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{port}/graphql"
        token = mint_token(settings, tenant=org, user="bench", scopes=["write:team"], ttl_s=86_400)
        with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=120) as c:
            for i in range(args.seed_docs):
                topic = TOPICS[i % len(TOPICS)]
                r = c.post(url, json={"query": UPSERT, "variables": {
                    "p": f"seed/{i}.md", "b": f"Notes on {topic} number {i}. " * 20}})
                assert r.status_code == 200 and "errors" not in r.json(), r.text
            c.post(url, json={"query": RECALL, "variables": {"q": "warm up the models"}})
        acknowledged = 0
        lock = threading.Lock()
        print(f"{'clients':>7} {'req/s':>8} {'recall p50/p95/p99 ms':>24} "
              f"{'write p50/p95/p99 ms':>24} {'errors':>6}")
        for n in counts:
            lat: dict[str, list[float]] = {"recall": [], "write": []}
            errors: list[str] = []
            acked = [0]
            stop_at = time.monotonic() + args.seconds

            def client(k: int, lat: dict[str, list[float]] = lat, errors: list[str] = errors,
                       acked: list[int] = acked, stop_at: float = stop_at, n: int = n) -> None:
                i = 0
                with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=120) as c:
                    while time.monotonic() < stop_at:
                        write = i % args.write_every == 0
                        body = ({"query": UPSERT, "variables": {
                                    "p": f"run{n}/{k}/{i}.md", "b": f"Client {k} wrote {i}. " * 10}}
                                if write else {"query": RECALL, "variables": {
                                    "q": f"What do the notes say about {TOPICS[i % len(TOPICS)]}?"}})
                        t0 = time.perf_counter()
                        try:
                            r = c.post(url, json=body)
                            ok = r.status_code == 200 and "errors" not in r.json()
                        except httpx.HTTPError as exc:
                            ok, r = False, None
                            with lock:
                                errors.append(str(exc))
                        elapsed = (time.perf_counter() - t0) * 1000
                        with lock:
                            lat["write" if write else "recall"].append(elapsed)
                            if ok and write:
                                acked[0] += 1
                            elif not ok and r is not None:
                                errors.append(r.text[:200])
                        i += 1

            threads = [threading.Thread(target=client, args=(k,)) for k in range(n)]
            t_start = time.monotonic()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            wall = time.monotonic() - t_start
            total = len(lat["recall"]) + len(lat["write"])
            acknowledged += acked[0]
            fmt = lambda v: "/".join(f"{percentile(v, q):.0f}" for q in (0.5, 0.95, 0.99))  # noqa: E731
            print(f"{n:>7} {total / wall:>8.1f} {fmt(lat['recall']):>24} {fmt(lat['write']):>24} "
                  f"{len(errors):>6}")
            if errors:
                failed = True
                print(f"  first error: {errors[0]}")
        server.should_exit = True
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
        failed = failed or not ok
        engine.dispose()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
