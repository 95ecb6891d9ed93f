"""Junk in derived memory over ordinary Markdown: the quality gates off (before) and on (after), one run.

The folder (default ``tests/fixtures/markdown``: README, changelog, contributing
guide, architecture notes and planning notes of fictional software, with code
blocks, URLs, badges, tables, logs and front matter) is ingested twice, into two
tenants, exactly as ``engram ingest`` does; the chunks are embedded, then every
derive job runs, with ``derive_quality_gates`` off in the first tenant and on in
the second. Counted per tenant: entities, profiles, observations and facts, and
among them the **junk** ones: an entity whose name is not a plausible name, a
profile, an observation or a fact whose text (profile: the part after its title)
is code, a URL, markup, numbers or a log line once its inline code and links are
masked as extraction masks them (``orchestrator.derive.quality.statement_junk``),
and observations whose text another observation already says (served twice); and the
RAPTOR and community summaries with a sentence that is junk so, a list of links
(``quality.link_list``) or part of an HTML comment, and those with Markdown markup a
reader never sees (a heading's hashes, a list marker, bold, a link's target). Up to
``--examples`` junk items per kind are printed.

    .venv/bin/python benchmarks/derive_junk.py [--folder PATH] [--examples 5]
"""

from __future__ import annotations

import argparse
import re
import sys
import uuid
from collections import Counter
from pathlib import Path

from sqlalchemy import text

from orchestrator.auth import Identity
from orchestrator.cli.ingest import ingest_paths
from orchestrator.db.engine import make_app_engine
from orchestrator.db.session import bound_session
from orchestrator.derive.quality import link_list, plausible_entity, statement_junk
from orchestrator.derive.summarize import split_sentences

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "markdown"


# Markdown a reader never sees, in a summary: a heading's hashes, a list marker opening a
# sentence, bold, a link's target.
_MARKUP = re.compile(r"(?:^|\s)#{1,6}\s|(?:^|[.!?:]\s)[-*+]\s|\*\*|\]\(")


def count(app: object, org: str, examples: int) -> tuple[dict[str, int], list[str]]:
    ident = Identity.of(org, "auditor", read=["docs"])
    figures: dict[str, int] = Counter()
    shown: list[str] = []
    with bound_session(app, ident) as session:  # type: ignore[arg-type]
        names = session.execute(text("select canonical_name from knowledge.entities "
                                     "where merged_into is null")).scalars().all()
        profiles = session.execute(text("select summary from memory.profiles")).scalars().all()
        observations = session.execute(text("select text from memory.observations "
                                            "where confidence >= 0.65")).scalars().all()
        facts = session.execute(text("select text from knowledge.fact_content")).scalars().all()
        summaries = session.execute(text(
            "select summary from memory.raptor_nodes union all "
            "select summary from memory.communities")).scalars().all()
    figures["entities"] = len(names)
    for n in names:
        if not plausible_entity(n):
            figures["junk entities"] += 1
            if figures["junk entities"] <= examples:
                shown.append(f"entity {n!r}")
    figures["profiles"] = len(profiles)

    def tally(kind: str, label: str, item: str, reason: str | None) -> None:
        if reason:
            figures[f"junk {kind}"] += 1
            if figures[f"junk {kind}"] <= examples:
                shown.append(f"{label} ({reason}) {item[:90]!r}")

    for p in profiles:
        title, _, body = p.partition(": ")
        tally("profiles", "profile", p,
              statement_junk(body) if plausible_entity(title.split(",")[0]) else "name")
    figures["recallable observations"] = len(observations)
    seen: Counter[str] = Counter(" ".join(o.split()).lower() for o in observations)
    for o in observations:
        tally("observations", "observation", o, statement_junk(o))
    figures["repeated observations"] = sum(n - 1 for n in seen.values() if n > 1)
    figures["facts (distinct sentences)"] = len(facts)
    for f in facts:
        tally("facts", "fact", f, statement_junk(f))
    figures["summaries (RAPTOR, communities)"] = len(summaries)
    for x in summaries:
        if _MARKUP.search(x):
            figures["summaries with markup"] += 1
            if figures["summaries with markup"] <= examples:
                shown.append(f"summary (markup) {x[:90]!r}")
        tally("summaries", "summary", x, next(
            (r for r in (statement_junk(s) or ("link list" if link_list(s) else None)
                         or ("html comment" if "<!--" in s or "-->" in s else None)
                         for s in split_sentences(x)) if r), None))
    return figures, shown


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", type=Path, default=FIXTURE)
    ap.add_argument("--examples", type=int, default=5)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from recall_quality import derive_tenant, embedded_database, make_tenant

    from orchestrator.cli.ingest import discover
    from orchestrator.worker.embedder import Embedder

    print(f"folder {args.folder}: {len(discover([args.folder], None).files)} files ingest reads")
    rows: dict[str, dict[str, int]] = {}
    examples: dict[str, list[str]] = {}
    with embedded_database() as (settings, admin, app, worker_url):
        embedder = Embedder.from_settings(settings)
        worker = make_app_engine(worker_url, pool_size=1)
        for gates in (False, True):
            label = "after (gates on)" if gates else "before (gates off)"
            run_settings = settings.model_copy(update={"derive_quality_gates": gates})
            org = f"markdown-{'on' if gates else 'off'}-{uuid.uuid4().hex[:6]}"
            tenant_id = make_tenant(admin, org, "docs")
            ident = Identity.of(org, "writer", write=["docs"])
            summary = ingest_paths(run_settings, app, ident, [args.folder], collection="readme",
                                   scopes=["docs"])
            print(f"{label}: {summary.files} files, {summary.chunks} chunks; "
                  + derive_tenant(app, worker, run_settings, embedder, org, tenant_id, "docs"))
            rows[label], examples[label] = count(app, org, args.examples)
        worker.dispose()
    keys = list(rows["before (gates off)"].keys() | rows["after (gates on)"].keys())
    order = ["entities", "junk entities", "profiles", "junk profiles", "recallable observations",
             "junk observations", "repeated observations", "facts (distinct sentences)", "junk facts",
             "summaries (RAPTOR, communities)", "junk summaries", "summaries with markup"]
    keys = [k for k in order if k in keys]
    print(f"\n{'':28s} {'before':>8s} {'after':>8s}")
    for k in keys:
        print(f"{k:28s} {rows['before (gates off)'].get(k, 0):8d} {rows['after (gates on)'].get(k, 0):8d}")
    for label, shown in examples.items():
        print(f"\njunk {label}:" + ("".join(f"\n  {s}" for s in shown) if shown else " none"))


if __name__ == "__main__":
    main()
