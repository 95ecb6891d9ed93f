"""Provenance benchmark: write overhead of the chain triggers, and verification speed.

Starts its own embedded PostgreSQL in a temporary home, migrates it, then
measures in the same run:

* documents written with ``put_document`` (one document row plus its chunks
  per call, ``--batch`` documents per transaction), with the chain triggers on
  and with them disabled (``ALTER TABLE ... DISABLE TRIGGER`` on every chained
  table); the ratio on/off is the overhead (goal: at most 1.3x);
* claims (``knowledge.fact_claim`` with interned content), ``--batch`` per
  transaction, on and off;
* chunks inserted by multi-row statements (``--rows`` per statement), on and
  off, which shows the statement-level trigger's amortisation;
* ``provenance.verify_chain`` (events/s) and ``provenance.verify_rows``
  (rows/s) over everything written.

Each round measures both sides back to back, in alternating order; the
overhead is the median of the per-round ratios (robust to a shared machine's
changing load), throughputs are the best round of each side. Usage::

    .venv/bin/python benchmarks/provenance.py [--docs 60] [--claims 40] [--batch 10] \
        [--rounds 5] [--rows 50] [--statements 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

from sqlalchemy import Engine, create_engine, insert, text

from orchestrator.auth import Identity
from orchestrator.db.engine import make_app_engine
from orchestrator.db.models import Chunk
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session
from orchestrator.ingest.documents import DocumentInput, put_document

PARAGRAPH = "Provenance benchmark paragraph about rivers, bridges and the people who cross them. "
BODY = (PARAGRAPH * 12 + "\n\n") * 4


def _tenant(admin: Engine) -> str:
    org = f"bench-{uuid.uuid4().hex[:10]}"
    with admin.begin() as conn:
        conn.execute(text("set local role engram_dba"))
        tid = conn.execute(text("select auth.create_tenant(:o, :o)"), {"o": org}).scalar_one()
        conn.execute(text("select auth.create_scope(:t, 'team', 'bench')"), {"t": tid})
    return org


def _set_chain(admin: Engine, enabled: bool) -> None:
    with admin.begin() as conn:
        tables = list(conn.execute(text("select provenance.chained_tables()::text")).scalars())
        conn.execute(text("set local role engram_owner"))
        for table in tables:
            name = table.split(".")[-1]
            for task in ("insert", "update", "delete"):
                conn.execute(text(f"alter table {table} {'enable' if enabled else 'disable'} "
                                  f"trigger tg_{name}__chain_{task}"))


def _docs_round(app: Engine, org: str, n: int, batch: int) -> float:
    ident = Identity.of(org, "bench", write=("team",))
    start = time.perf_counter()
    for b in range(0, n, batch):
        with bound_session(app, ident) as s:
            for i in range(b, min(n, b + batch)):
                put_document(s, DocumentInput("bench", f"d{i}.md", f"Doc {i}", f"{i} {BODY}", ("team",)))
    return time.perf_counter() - start


def _chunks_round(app: Engine, org: str, statements: int, rows: int) -> float:
    ident = Identity.of(org, "bench", write=("team",))
    with bound_session(app, ident) as s:
        doc = put_document(s, DocumentInput("bench", "host.md", "Host", "host", ("team",))).document_id
    start = time.perf_counter()
    with bound_session(app, ident) as s:
        for k in range(statements):
            s.execute(insert(Chunk).values([
                {"document_id": doc, "ordinal": 1 + k * rows + j, "text": f"chunk {k}-{j} {BODY[:300]}",
                 "char_start": 0, "char_end": 300} for j in range(rows)]))
    return time.perf_counter() - start


def _claims_round(app: Engine, org: str, n: int, batch: int) -> float:
    ident = Identity.of(org, "bench", write=("team",))
    with bound_session(app, ident) as s:
        scopes = [s.execute(text("select id from auth.scopes where name = 'team'")).scalar_one()]
        subject = s.execute(text("select knowledge.resolve_entity('person', 'Ann Lee', :sc)"),
                            {"sc": scopes}).scalar_one()
    start = time.perf_counter()
    for b in range(0, n, batch):
        with bound_session(app, ident) as s:
            for i in range(b, min(n, b + batch)):
                s.execute(text(
                    "insert into knowledge.fact_claim (content_id, subject_id, predicate, object_value, "
                    "object_datatype, scopes, epistemic_kind) values (knowledge.intern_content(:c), :s, "
                    "'note', :v, 'string', :sc, 'observation')"),
                    {"c": f"note {i} {PARAGRAPH}", "s": subject, "v": f"value {i}", "sc": scopes})
    return time.perf_counter() - start


def _paired(fn: Callable[[bool], float], rounds: int) -> tuple[float, float, float]:
    """Best time on, best time off, and the median of the per-pair ratios.

    Each round measures both sides back to back (alternating which goes first),
    so a change in the machine's load between rounds falls on both sides of a
    ratio; the median of the ratios is the overhead reported.
    """
    on, off, ratios = [], [], []
    for r in range(rounds):
        pair = {}
        for enabled in ((True, False) if r % 2 == 0 else (False, True)):
            pair[enabled] = fn(enabled)
        on.append(pair[True])
        off.append(pair[False])
        ratios.append(pair[True] / pair[False])
    return min(on), min(off), statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=60, help="documents per round")
    ap.add_argument("--batch", type=int, default=10, help="documents per transaction")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each measures on and off")
    ap.add_argument("--rows", type=int, default=50, help="chunks per multi-row INSERT")
    ap.add_argument("--claims", type=int, default=40, help="claims per round")
    ap.add_argument("--statements", type=int, default=8, help="multi-row INSERTs per round")
    args = ap.parse_args()

    with scratch_database() as db:
        admin = create_engine(db.admin_url())
        app = make_app_engine(db.app_url())

        def docs(enabled: bool) -> float:
            _set_chain(admin, enabled)
            return _docs_round(app, _tenant(admin), args.docs, args.batch)

        def chunks(enabled: bool) -> float:
            _set_chain(admin, enabled)
            return _chunks_round(app, _tenant(admin), args.statements, args.rows)

        _docs_round(app, _tenant(admin), max(5, args.docs // 10), args.batch)  # warm-up
        d_on, d_off, d_ratio = _paired(docs, args.rounds)
        c_on, c_off, c_ratio = _paired(chunks, args.rounds)
        with admin.connect() as conn:
            has_claims = conn.execute(text("select to_regclass('knowledge.fact_claim')")).scalar() is not None
        if has_claims:
            def claims(enabled: bool) -> float:
                _set_chain(admin, enabled)
                return _claims_round(app, _tenant(admin), args.claims, args.batch)

            k_on, k_off, k_ratio = _paired(claims, args.rounds)
        _set_chain(admin, True)

        with admin.connect() as conn:
            n_events = conn.execute(text("select count(*) from provenance.events")).scalar_one()
            t0 = time.perf_counter()
            checked = int(conn.execute(text(
                "select sum(checked) from provenance.verify_chain()")).scalar_one())
            t_chain = time.perf_counter() - t0
            t0 = time.perf_counter()
            problems = conn.execute(text("select count(*) from provenance.verify_rows()")).scalar_one()
            t_rows = time.perf_counter() - t0
            n_rows = conn.execute(text(
                "select (select count(*) from sources.documents) + (select count(*) from sources.chunks)"
            )).scalar_one()

        print(f"provenance benchmark: {args.docs} documents and {args.claims} claims per round in "
              f"transactions of {args.batch}, {args.rounds} rounds of on/off pairs")
        print(f"  documents  chain on : {args.docs / d_on:8.1f} docs/s  ({d_on:.3f} s)")
        print(f"  documents  chain off: {args.docs / d_off:8.1f} docs/s  ({d_off:.3f} s)")
        print(f"  documents  overhead : {d_ratio:8.2f}x  median of per-round ratios (goal <= 1.30x)")
        total = args.statements * args.rows
        print(f"  chunks x{args.rows}/stmt on : {total / c_on:8.1f} rows/s  ({c_on:.3f} s)")
        print(f"  chunks x{args.rows}/stmt off: {total / c_off:8.1f} rows/s  ({c_off:.3f} s)")
        print(f"  chunks     overhead : {c_ratio:8.2f}x  median of per-round ratios (goal <= 1.30x)")
        if has_claims:
            print(f"  claims     chain on : {args.claims / k_on:8.1f} claims/s  ({k_on:.3f} s)")
            print(f"  claims     chain off: {args.claims / k_off:8.1f} claims/s  ({k_off:.3f} s)")
            print(f"  claims     overhead : {k_ratio:8.2f}x  median of per-round ratios (goal <= 1.30x)")
        else:
            print("  claims: skipped, knowledge.fact_claim is not migrated")
        print(f"  verify_chain: {checked} events in {t_chain:.3f} s = {checked / t_chain:,.0f} events/s "
              f"({n_events} events stored)")
        print(f"  verify_rows : {n_rows} rows in {t_rows:.3f} s = {n_rows / t_rows:,.0f} rows/s "
              f"({problems} problems; rows written with the chain off are reported, as they should be)")
        admin.dispose()
        app.dispose()


if __name__ == "__main__":
    main()
