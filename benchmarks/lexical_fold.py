"""BM25 statistics: what folding a tenant's df deltas costs, 0041's fold beside 0090's, in one run.

Every chunk write appends its lexemes to ``recall.lexical_term_deltas``; the worker and the
derive tick fold them into ``recall.lexical_terms`` (one row per tenant, scope set and
lexeme). After ``engram ingest /usr/share/doc`` (26,155 chunks: 19,491 delta rows, 1.25
million lexemes, 354,375 keys) 0041's fold ran for minutes; 0090 made it linear (see that
migration). This benchmark starts a throwaway embedded PostgreSQL at head, installs 0041's
fold beside the current one (as ``recall.fold_lexical_terms_0041``, from the released
migration's own text), and times both on the same synthetic deltas, each on a fresh tenant
of its own:

1. **bulk**: ``--rows`` delta rows of ``--lexemes`` lexemes each, drawn from a Zipf
   vocabulary of ``--vocabulary`` words (what a large ingest leaves): the first half folded
   as the worker folds while an ingest runs, then the second half folded at once and timed,
   with the planner's statistics gathered before the tenant wrote anything (a large ingest
   outruns autovacuum's next analyze; autovacuum is off on the two tables here);
2. **steady**: then ``--steady`` rounds of a few small deltas (an edit: some lexemes out,
   some in), each folded, p50 per fold;
3. the rows each fold left at ``chunks = 0`` (0041's delete never saw them).

A fold that runs past ``--timeout`` seconds is stopped and printed as such.

    .venv/bin/python benchmarks/lexical_fold.py [--rows 20000] [--lexemes 64] [--vocabulary 1000000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import create_engine, pool, text
from sqlalchemy.exc import OperationalError

from orchestrator.db.migrate import released_sql
from orchestrator.db.scratch import scratch_database


def released_fold() -> str:
    """0041's fold, as released, renamed ``recall.fold_lexical_terms_0041``."""
    return released_sql("0041_lexical_terms", "TRIGGER", "create function recall.fold_lexical_terms(",
                        "comment on function recall.fold_lexical_terms(").replace(
        "recall.fold_lexical_terms(", "recall.fold_lexical_terms_0041(", 1)


def deltas(rng: np.random.Generator, rows: int, lexemes: int, vocabulary: int,
           zipf: float = 1.05) -> list[list[str]]:
    """``rows`` arrays of ``lexemes`` distinct Zipf-drawn words each."""
    out = []
    for _ in range(rows):
        drawn = np.unique(rng.zipf(zipf, lexemes * 2) % vocabulary)[:lexemes]
        out.append([f"w{n}" for n in drawn])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--lexemes", type=int, default=64)
    ap.add_argument("--vocabulary", type=int, default=1000000)
    ap.add_argument("--zipf", type=float, default=1.05)
    ap.add_argument("--steady", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    started = time.monotonic()
    rng = np.random.default_rng(args.seed)
    bulk = deltas(rng, args.rows, args.lexemes, args.vocabulary, args.zipf)
    edits = [(bulk[i * 3:i * 3 + 3], deltas(rng, 3, args.lexemes, args.vocabulary, args.zipf))
             for i in range(args.steady)]  # each edit takes out rows the bulk put in
    print(f"deltas: {args.rows:,} rows of {args.lexemes} lexemes ({sum(map(len, bulk)):,} in all) "
          f"from a vocabulary of {args.vocabulary:,}; then {args.steady} edits of 3 rows out, 3 in")
    with scratch_database() as db:
        eng = create_engine(db.admin_url(), poolclass=pool.NullPool)
        with eng.begin() as conn:
            conn.execute(text(released_fold()))
            for table in ("recall.lexical_terms", "recall.lexical_term_deltas"):
                conn.execute(text(f"alter table {table} set (autovacuum_enabled = false)"))
        half = len(bulk) // 2
        scope = [uuid.uuid4()]
        results: dict[str, dict[str, object]] = {}
        insert = text("insert into recall.lexical_term_deltas (tenant_id, scopes, sign, lexemes) "
                      "select :t, :s, :n, x.l from jsonb_to_recordset(cast(:d as jsonb)) "
                      "as x(l text[])")
        for label, function in (("0041", "recall.fold_lexical_terms_0041"),
                                ("0090", "recall.fold_lexical_terms")):
            tenant, warm = uuid.uuid4(), uuid.uuid4()
            with eng.begin() as conn:
                for t, org in ((tenant, f"fold-{label}"), (warm, f"warm-{label}")):
                    conn.execute(text("insert into auth.tenants (id, org_id, name) values (:t, :o, :o)"),
                                 {"t": t, "o": org})
            fold = text(f"select {function}(1, :t)")
            # One connection, as the worker's: its first folds (of another tenant) leave the
            # function's plans cached on it, as a long-running worker's are.
            with eng.connect() as worker:
                for _ in range(8):
                    with eng.begin() as conn:
                        conn.execute(insert, {"t": warm, "s": scope, "n": 1,
                                              "d": json.dumps([{"l": d} for d in bulk[:3]])})
                    worker.execute(fold, {"t": warm})
                    worker.commit()
                # The statistics the planner has were gathered before this tenant wrote
                # anything (autovacuum off: a large ingest outruns its next analyze), and the
                # worker folded the first half of the ingest already.
                with eng.begin() as conn:
                    conn.execute(text("analyze recall.lexical_terms"))
                    conn.execute(text("analyze recall.lexical_term_deltas"))
                    conn.execute(insert, {"t": tenant, "s": scope, "n": 1,
                                          "d": json.dumps([{"l": d} for d in bulk[:half]])})
                worker.execute(fold, {"t": tenant})
                worker.commit()
                with eng.begin() as conn:
                    conn.execute(insert, {"t": tenant, "s": scope, "n": 1,
                                          "d": json.dumps([{"l": d} for d in bulk[half:]])})
                t0 = time.perf_counter()
                try:
                    worker.execute(text(f"set statement_timeout = {int(args.timeout * 1000)}"))
                    worker.execute(fold, {"t": tenant})
                    worker.commit()
                    bulk_s: float | None = time.perf_counter() - t0
                except OperationalError:
                    worker.rollback()
                    bulk_s = None
                steady = []
                if bulk_s is not None:
                    for out, into in edits:
                        with eng.begin() as conn:
                            for sign, rows in ((-1, out), (1, into)):
                                conn.execute(insert, {"t": tenant, "s": scope, "n": sign,
                                                      "d": json.dumps([{"l": d} for d in rows])})
                        t1 = time.perf_counter()
                        worker.execute(fold, {"t": tenant})
                        worker.commit()
                        steady.append((time.perf_counter() - t1) * 1000)
            with eng.connect() as conn:
                keys, zero = conn.execute(text(
                    "select count(*), count(*) filter (where chunks = 0) from recall.lexical_terms "
                    "where tenant_id = :t"), {"t": tenant}).one()
            results[label] = {"bulk": bulk_s, "steady": statistics.median(steady) if steady else None,
                              "keys": keys, "zero": zero}
        eng.dispose()
    print(f"{'fold':6s} {'bulk fold s':>12s} {'keys':>9s} {'edit fold p50 ms':>17s} {'rows at 0':>10s}")
    for label, r in results.items():
        bulk_text = f"{r['bulk']:.2f}" if r["bulk"] is not None else f">{args.timeout:.0f} (stopped)"
        steady_text = f"{r['steady']:.1f}" if r["steady"] is not None else "-"
        print(f"{label:6s} {bulk_text:>12s} {r['keys']:>9,} {steady_text:>17s} {r['zero']:>10,}")
    old, new = results["0041"]["bulk"], results["0090"]["bulk"]
    if isinstance(old, float) and isinstance(new, float) and new > 0:
        print(f"bulk fold 0041 / 0090: {old / new:.1f}x")
    print(f"whole run: {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
