"""The conflict sweep: what ``knowledge.find_conflicts`` costs over a tenant, 0004's beside 0091's.

The derive tick's ``conflicts`` job sweeps the whole tenant (``detect_conflicts``) under the
tenant's exclusive conflict lock, which every claim write of the tenant waits for. Extraction
writes claims no shape can make contradict (``mentioned_in``, ``co_mentioned_with``), many of
them about one popular subject; 0004's sweep paired them all before asking the shapes, 0091's
pairs only claims of shaped predicates. This benchmark starts a throwaway embedded PostgreSQL,
installs 0004's function beside the current one (as ``knowledge.find_conflicts_0004``, from
the released migration's own text), writes ``--claims`` claims about one subject (unshaped
``co_mentioned_with``) and a few of a functional predicate that do conflict, and times both
sweeps as the app role under RLS, printing what each found (the same pairs) and p50 of
``--runs`` runs.

    .venv/bin/python benchmarks/conflict_sweep.py [--claims 6000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, pool, text

from orchestrator.admin import create_scope, create_tenant
from orchestrator.auth import Identity
from orchestrator.db.engine import make_app_engine
from orchestrator.db.migrate import released_sql
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session
from orchestrator.ingest.knowledge import FactInput, assert_facts, resolve_entity


def released_find_conflicts() -> str:
    """0004's ``find_conflicts``, as released, renamed ``knowledge.find_conflicts_0004``."""
    return released_sql("0004_knowledge", "FUNCTIONS_SQL", "create function knowledge.find_conflicts(",
                        "comment on function knowledge.find_conflicts(").replace(
        "knowledge.find_conflicts(", "knowledge.find_conflicts_0004(", 1) + (
        "\ngrant execute on function knowledge.find_conflicts_0004(uuid) to engram_app;")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--claims", type=int, default=6000)
    ap.add_argument("--objects", type=int, default=300)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    started = time.monotonic()
    with scratch_database() as db:
        admin = create_engine(db.admin_url(), poolclass=pool.NullPool)
        with admin.begin() as conn:
            conn.execute(text(released_find_conflicts()))
        create_tenant(db, "sweep", "Sweep")
        create_scope(db, "sweep", "team", "Everyone")
        app = make_app_engine(db.app_url())
        who = Identity.of("sweep", "bench", read=["team"], write=["team"])
        with bound_session(app, who) as s:
            subject = resolve_entity(s, "organization", "Debian", ["team"])
            objects = [resolve_entity(s, "product", f"Package {i}", ["team"]) for i in range(args.objects)]
        with admin.begin() as conn:  # a DBA's shape
            conn.execute(text("insert into knowledge.shapes (tenant_id, predicate, max_count) select id, "
                              "'status', 1 from auth.tenants where org_id = 'sweep'"))
        assert subject is not None
        facts = [FactInput(subject_id=subject, predicate="co_mentioned_with",
                           text=f"Debian and Package {i % args.objects} are named in page {i}.",
                           scopes=("team",), object_id=objects[i % args.objects], kind="world_fact",
                           author_role="extractor", confidence=0.5)
                 for i in range(args.claims)]
        facts += [FactInput(subject_id=subject, predicate="status", text=f"Debian is {v}.",
                            scopes=("team",), value=v) for v in ("stable", "testing", "frozen")]
        for i in range(0, len(facts), 1000):
            with bound_session(app, who) as s:
                assert_facts(s, facts[i:i + 1000])
        print(f"{args.claims:,} co_mentioned_with claims about one subject (no shape), 3 claims of "
              "'status' (max_count 1) about it")
        for label, function in (("0004", "knowledge.find_conflicts_0004"),
                                ("0091", "knowledge.find_conflicts")):
            times, found = [], None
            for _ in range(args.runs):
                with bound_session(app, who) as s:
                    t0 = time.perf_counter()
                    pairs = s.execute(text(f"select kind::text, claim_a, claim_b from {function}(null) "
                                           "order by 2, 3")).all()
                    times.append((time.perf_counter() - t0) * 1000)
                found = [tuple(p) for p in pairs]
            kinds = ", ".join(sorted({k for k, _, _ in found or []}))
            print(f"{label}: sweep p50 {statistics.median(times):9.1f} ms over {args.runs} runs; "
                  f"{len(found or [])} conflicting pairs ({kinds})")
        app.dispose()
        admin.dispose()
    print(f"whole run: {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
