"""Recall over a folder of ordinary Markdown: where the page that answers each question comes.

The folder (default: npm's own docs as npm ships them, ``/usr/lib/node_modules/npm/docs/
content``, 91 pages) is ingested into a fresh tenant exactly as ``engram ingest`` does (front
matter included), its chunks are embedded and, unless ``--no-derive``, every derive job runs
as it would in a live home. Each question of ``--questions`` (a JSON file: ``{"questions":
[{"question": ..., "page": <the answering document's title>, "section": <optional: words
of the heading of the section that answers>}, ...]}``; default
``benchmarks/data/npm_docs_questions.json``, 20 questions written in a user's words) is asked
with each plan-study shape of ``--shapes`` (default ``learned,fused``: the shipped ranker and
the fused order it replaces) at the largest budget, and scored by the position of the first
served excerpt of the answering page: mean reciprocal rank, and how many come first and in
the first three, side by side, with each question's positions. ``--without-summary`` adds a
second tenant ingested as before stop 41 (the front matter's ``description`` left out of the
body), scored in the same run. A second question file, ``benchmarks/data/
node_api_questions.json`` (22 questions), asks Node.js's API reference as Debian's nodejs
package ships it (``--folder /usr/share/doc/nodejs/api``, 64 pages of short sections), and a
third, ``benchmarks/data/node_contributing_questions.json`` (22 questions), Node.js's
contributor guides (its ``about`` says which pages, copied into one folder), and a fourth,
``benchmarks/data/cmake_questions.json`` (22 questions), CMake's reference in
reStructuredText (its command and manual pages, copied into one folder), and a fifth,
``benchmarks/data/rust_book_questions.json`` (24 questions), the Rust book in HTML as rustup
installs it (its top-level pages copied into one folder: 112 mdBook chapters, 83 stubs
ingest leaves out).

``--vary SETTING=V1,V2`` asks every question again with each value of one recall setting
(``recall_mmr_cap_discount=0.5,1.0``), a column per shape and value, on the same tenant.

    .venv/bin/python benchmarks/docs_questions.py [--folder PATH] [--questions FILE]
        [--shapes learned,fused] [--no-derive] [--without-summary] [--vary SETTING=V1,V2]
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from contextlib import nullcontext
from pathlib import Path
from typing import Any
from unittest.mock import patch

DEFAULT_FOLDER = Path("/usr/lib/node_modules/npm/docs/content")
DEFAULT_QUESTIONS = Path(__file__).resolve().parent / "data" / "npm_docs_questions.json"


def load_questions(path: Path) -> list[tuple[str, str, str | None]]:
    """(question, page title, section heading or None) triples; a file that is not such a
    list is refused by name."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        items = data["questions"] if isinstance(data, dict) else data
        triples = [(str(q["question"]), str(q["page"]),
                    str(q["section"]) if q.get("section") else None) for q in items]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SystemExit(f"{path}: not a questions file ({exc})") from None
    if not triples:
        raise SystemExit(f"{path}: no questions")
    return triples


def section_span(body: str, section: str) -> tuple[int, int] | None:
    """Where in ``body`` the section whose heading holds ``section`` runs: from its heading to
    the next heading of its level or above (found from the text itself, not from anything
    the engine stores, so code before and after a change is scored alike)."""
    from orchestrator.markdown import headings

    found = list(headings(body))
    for i, (at, level, words) in enumerate(found):
        if section in words:
            end = next((a for a, lv, _ in found[i + 1:] if lv <= level), len(body))
            return at, end
    return None


def position(res: Any, page: str, span: tuple[int, int] | None = None) -> int | None:
    """1-based position of the first served excerpt of the document titled ``page`` (with
    ``span``: one that starts inside that part of its body, or holds its start)."""
    for i, e in enumerate(res.evidence):
        if e.source is None or e.source.title != page:
            continue
        if span is None or (e.char_start is not None and e.char_end is not None and (
                span[0] <= e.char_start < span[1] or e.char_start <= span[0] < e.char_end)):
            return i + 1
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", type=Path, default=DEFAULT_FOLDER)
    ap.add_argument("--questions", type=Path, default=DEFAULT_QUESTIONS)
    ap.add_argument("--shapes", default="learned,fused", help="plan-study shapes, a,b")
    ap.add_argument("--no-derive", action="store_true", help="embed only; run no derive job")
    ap.add_argument("--without-summary", action="store_true",
                    help="also a tenant ingested as before stop 41: the front matter's "
                         "description left out of the body (cli.ingest.with_summary)")
    ap.add_argument("--vary", default="", help="SETTING=V1,V2: each value of one recall "
                    "setting, a column each (recall_mmr_cap_discount=0.5,1.0)")
    args = ap.parse_args()
    if not args.folder.is_dir():
        raise SystemExit(f"{args.folder}: no such folder (give --folder)")
    questions = load_questions(args.questions)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from recall_quality import derive_tenant, embedded_database, make_tenant

    from orchestrator.auth import Identity
    from orchestrator.cli.ingest import ingest_paths
    from orchestrator.db.engine import make_app_engine
    from orchestrator.recall import PLAN_STUDY, Recaller
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.queue import QueueWorker

    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    unknown = [s for s in shapes if s not in PLAN_STUDY]
    if unknown:
        raise SystemExit(f"unknown shapes {unknown}; known: {', '.join(PLAN_STUDY)}")
    tenants = [("", False)] + ([(", no summary", True)] if args.without_summary else [])
    name, _, values = args.vary.partition("=")
    variants: list[tuple[str, dict[str, Any]]] = [("", {})]
    if args.vary:
        from orchestrator.config import Settings

        if name not in Settings.model_fields or not values:
            raise SystemExit(f"--vary {args.vary}: give SETTING=V1,V2 with a known setting")
        from pydantic import TypeAdapter, ValidationError

        # Parsed as the setting's type ("false" is False for a bool, which bool("false") is not).
        parse = TypeAdapter(Settings.model_fields[name].annotation)
        try:
            variants = [(f" {name.removeprefix('recall_')}={v}", {name: parse.validate_python(v)})
                        for v in values.split(",")]
        except ValidationError as exc:
            raise SystemExit(f"--vary {args.vary}: {exc.errors()[0]['msg']}") from None
    columns = [f"{shape}{label}{tag}" for tag, _ in tenants for shape in shapes
               for label, _ in variants]
    found: dict[str, list[int | None]] = {c: [] for c in columns}
    with embedded_database() as (settings, admin, app, worker_url):
        settings = settings.model_copy(update={"rank_usage_rows": False})
        embedder = Embedder.from_settings(settings)
        worker = make_app_engine(worker_url, pool_size=1)
        recallers = {label: Recaller(app, settings.model_copy(update=update), embedder=embedder)
                     for label, update in variants}
        for tag, without in tenants:
            org = f"docs-{uuid.uuid4().hex[:6]}"
            tenant_id = make_tenant(admin, org, "docs")
            writer = Identity.of(org, "writer", write=["docs"])
            keep = (patch("orchestrator.cli.ingest.with_summary", lambda body, meta: body)
                    if without else nullcontext())
            with keep:
                summary = ingest_paths(settings, app, writer, [args.folder], collection="docs",
                                       scopes=["docs"])
            print(f"tenant{tag or ''}: {summary.files} files of {args.folder}, {summary.chunks} "
                  f"chunks, {len(summary.failed)} failed")
            if args.no_derive:
                rows = QueueWorker(worker, embedder, settings, tenants=[tenant_id]).drain().rows
                print(f"  embedded {rows} chunks; no derive job run (--no-derive)")
            else:
                print("  " + derive_tenant(app, worker, settings, embedder, org, tenant_id, "docs"))
            reader = Identity.of(org, "newcomer", read=["docs"])
            spans = _spans(app, reader, questions)
            for question, page, section in questions:
                for shape in shapes:
                    for label, recaller in recallers.items():
                        res, _ = recaller.study(reader, question, PLAN_STUDY[shape],
                                                budget_tokens=settings.recall_max_budget_tokens)
                        found[f"{shape}{label}{tag}"].append(
                            position(res, page, spans.get((page, section))))
        worker.dispose()
    print(f"\n{len(questions)} questions ({args.questions}); position of the answering page's "
          "first excerpt, or of its answering section's where one is named (- not served)")
    width = max(9, *(len(c) for c in columns))
    print(f"{'page':24s} " + " ".join(f"{c:>{width}s}" for c in columns) + "  question")
    for i, (question, page, section) in enumerate(questions):
        cells = " ".join(f"{found[c][i] if found[c][i] is not None else '-':>{width}}"
                         for c in columns)
        print(f"{(section or page)[:24]:24s} {cells}  {question}")
    print(f"\n{'shape':{width}s} {'MRR':>6s} {'first':>6s} {'top 3':>6s} {'top 10':>7s}")
    n = len(questions)
    for c in columns:
        ranks = found[c]
        mrr = sum(1 / r for r in ranks if r) / n
        print(f"{c:{width}s} {mrr:6.3f} {sum(r == 1 for r in ranks):6d} "
              f"{sum(bool(r and r <= 3) for r in ranks):6d} {sum(bool(r and r <= 10) for r in ranks):7d}")


def _spans(app: Any, reader: Any, questions: list[tuple[str, str, str | None]]
           ) -> dict[tuple[str, str | None], tuple[int, int]]:
    """For each (page, section) the questions name, the section's span in the page's stored
    body (read as the reader); a section no heading holds is refused by name."""
    from sqlalchemy import select

    from orchestrator.db.models import Document
    from orchestrator.db.session import bound_session

    wanted = {(page, section) for _, page, section in questions if section}
    spans: dict[tuple[str, str | None], tuple[int, int]] = {}
    if not wanted:
        return spans
    with bound_session(app, reader) as session:
        rows = session.execute(select(Document.title, Document.body).where(
            Document.title.in_({page for page, _ in wanted}))).all()
    bodies = {row.title: row.body for row in rows}
    for page, section in sorted(wanted, key=str):
        span = section_span(bodies.get(page, ""), section or "")
        if span is None:
            raise SystemExit(f"no heading of the page {page!r} holds {section!r}")
        spans[(page, section)] = span
    return spans


if __name__ == "__main__":
    main()
