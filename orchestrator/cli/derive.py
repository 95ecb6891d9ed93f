"""``engram derive <job>`` and ``engram lifecycle ...``: derived-memory jobs on demand.

Every command runs as ``engram_app`` under the identity of a verified token (or
one minted with the development key), so a job sees and changes exactly what
that identity may. ``engram lifecycle sweep`` is a dry run unless ``--apply``;
``pin``, ``unpin``, ``snooze``, ``archive``, ``unarchive`` and ``mark-used`` act
on one document by id. Long jobs show a progress bar on a terminal
(``orchestrator.cli.progress``). Exit status: 0 on success, 1 when the job
failed (or the document is not found or not writable), 2 for bad input.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, date, datetime
from typing import Annotated, NoReturn, TypeVar

import typer
from sqlalchemy.orm import Session

from orchestrator.cli.auth import cli_identity
from orchestrator.cli.output import console, echo_plain, styled
from orchestrator.cli.progress import progress_bar
from orchestrator.config import Settings
from orchestrator.derive import lifecycle
from orchestrator.derive.poison import Skipped
from orchestrator.errors import BadInput, EngramError

T = TypeVar("T")

derive_app = typer.Typer(help="Run a derived-memory job now (the worker runs them in the background).",
                         no_args_is_help=True)
lifecycle_app = typer.Typer(help="Lifecycle policies: archive documents unused for N days.",
                            no_args_is_help=True)
out = console()
err = console(stderr=True)

Token = Annotated[str | None, typer.Option(envvar="ENGRAM_TOKEN", help="bearer token")]
Tenant = Annotated[str | None, typer.Option(help="mint a dev-key token for this tenant")]
User = Annotated[str, typer.Option(help="user of a minted token")]
Scopes = Annotated[str | None, typer.Option(help="scopes of a minted token, e.g. write:team")]


def _fail(message: str, code: int) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(code)


def _run(token: str | None, tenant: str | None, user: str, scopes: str | None,
         job: Callable[[Session], T], name: str | None = None) -> T:
    """``job`` in one transaction as the token's identity. A derive job (``name`` given) that
    fails on one item runs again item by item and skips it (``orchestrator.derive.poison``):
    the skipped items are printed, and the run is kept in ``memory.job_runs``."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.db.session import bound_session
    from orchestrator.derive import poison

    settings = Settings()
    try:
        identity = cli_identity(settings, token=token, tenant=tenant, user=user, scopes=scopes)
    except EngramError as exc:
        _fail(str(exc), 2)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)

    def sessions() -> AbstractContextManager[Session]:
        return bound_session(engine, identity)

    started_at = datetime.now(UTC)
    try:
        if name is None:
            with sessions() as session:
                return job(session)
        result, skipped = poison.run_guarded(sessions, job, what=f"derive {name}")
        _show_skipped(skipped)
        if skipped:
            poison.record_run(sessions, name, ok=True, line=f"{len(skipped)} skipped", skipped=skipped,
                              started_at=started_at, keep_days=settings.derive_job_runs_keep_days)
        return result
    except BadInput as exc:
        _fail(str(exc), 2)
    except EngramError as exc:
        _fail(str(exc), 1)
    finally:
        engine.dispose()


def _show_skipped(skipped: Sequence[Skipped]) -> None:
    for s in skipped:
        err.print(styled("note:", "yellow", f" {s}"))
    if skipped:
        err.print(styled(f"{len(skipped)} items skipped", "yellow",
                         "; the rest was written (kept in memory.job_runs)"))


def _moment(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"--as-of {value!r} is not an ISO 8601 moment", 2)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@lifecycle_app.command("sweep")
def sweep(
    apply: Annotated[bool, typer.Option("--apply", help="archive the listed documents")] = False,
    as_of: Annotated[str | None, typer.Option(help="judge staleness as of this moment (ISO 8601)")] = None,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """List the documents past their collection's policy; --apply archives exactly those."""
    moment = _moment(as_of)
    report = _run(token, tenant, user, scopes,
                  lambda s: lifecycle.sweep(s, apply=apply, as_of=moment), "lifecycle" if apply else None)
    verb = "archived" if report.applied else "would archive"
    # Plain tab-separated lines (rich would expand the tabs) so scripts can cut columns.
    for it in report.items:
        echo_plain(f"{verb}\t{it.collection}\t{it.path}\t{it.document_id}\t"
                   f"last used {it.last_used_at.isoformat()}\tpolicy {it.archive_after_days} days\t"
                   f"{it.uses} uses on {it.days_used} days")
    note = "" if report.applied else " (dry run; --apply to archive)"
    out.print(f"{len(report.items)} documents {verb}{note}")


@lifecycle_app.command("policy")
def policy(
    collection: Annotated[str, typer.Argument(help="collection the policy applies to")],
    archive_after_days: Annotated[int | None, typer.Option(
        "--archive-after-days", help="archive after this many days without use")] = None,
    remove: Annotated[bool, typer.Option("--remove", help="remove the collection's policy")] = False,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Set (--archive-after-days N) or remove (--remove) a collection's lifecycle policy."""
    if remove == (archive_after_days is not None):
        _fail("give exactly one of --archive-after-days N or --remove", 2)
    if remove:
        gone = _run(token, tenant, user, scopes, lambda s: lifecycle.remove_policy(s, collection))
        out.print(f"policy for {collection} removed" if gone else f"no policy for {collection}")
        return
    assert archive_after_days is not None
    days = archive_after_days

    def set_policy(s: Session) -> int:
        lifecycle.set_policy(s, collection, days)
        return lifecycle.collection_documents(s, [collection])[collection]

    held = _run(token, tenant, user, scopes, set_policy)
    out.print(f"{collection}: archive after {days} days without use")
    if not held:
        out.print(f"(no document you can read is in collection {collection!r} yet: check the "
                  "name; `engram lifecycle policies` lists the policies and their documents)",
                  style="yellow")


@lifecycle_app.command("policies")
def policies(token: Token = None, tenant: Tenant = None, user: User = "dev",
             scopes: Scopes = None) -> None:
    """List the tenant's lifecycle policies and how many documents you can read in each."""
    from rich.table import Table

    def listing(s: Session) -> list[tuple[lifecycle.Policy, int]]:
        found = lifecycle.policies(s)
        held = lifecycle.collection_documents(s, [p.collection for p in found])
        return [(p, held[p.collection]) for p in found]

    found = _run(token, tenant, user, scopes, listing)
    if not found:
        out.print("no lifecycle policies: engram lifecycle policy COLLECTION "
                  "--archive-after-days N")
        return
    table = Table("collection", "archive after (days without use)", "documents you can read")
    for p, held in found:
        table.add_row(p.collection, str(p.archive_after_days), str(held))
    out.print(table)


def _document_id(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        _fail(f"{value!r} is not a document id (a UUID, e.g. from `engram lifecycle sweep` or a recall)", 2)


DocumentId = Annotated[str, typer.Argument(help="the document's id (UUID)")]


@lifecycle_app.command("pin")
def pin(document: DocumentId, token: Token = None, tenant: Tenant = None, user: User = "dev",
        scopes: Scopes = None) -> None:
    """Pin a document: boosted in recall and never archived by a sweep."""
    doc = _document_id(document)
    _run(token, tenant, user, scopes, lambda s: lifecycle.pin(s, doc, True))
    out.print(f"pinned {doc}")


@lifecycle_app.command("unpin")
def unpin(document: DocumentId, token: Token = None, tenant: Tenant = None, user: User = "dev",
          scopes: Scopes = None) -> None:
    """Unpin a document (sweeps may archive it again)."""
    doc = _document_id(document)
    _run(token, tenant, user, scopes, lambda s: lifecycle.pin(s, doc, False))
    out.print(f"unpinned {doc}")


@lifecycle_app.command("snooze")
def snooze(
    document: DocumentId,
    days: Annotated[float, typer.Option("--days", help="hide from recall for this many days (0 wakes it)")],
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Hide a document from recall for --days days; --days 0 wakes it now."""
    doc = _document_id(document)
    until = _run(token, tenant, user, scopes, lambda s: lifecycle.snooze(s, doc, days))
    out.print(f"woke {doc}" if days == 0 else f"snoozed {doc} until {until.isoformat()}")


@lifecycle_app.command("archive")
def archive(document: DocumentId, token: Token = None, tenant: Tenant = None, user: User = "dev",
            scopes: Scopes = None) -> None:
    """Archive a document now (hidden from recall, left out of RAPTOR), whatever the policy."""
    doc = _document_id(document)
    when = _run(token, tenant, user, scopes, lambda s: lifecycle.archive(s, doc, True))
    out.print(f"archived {doc} at {when.isoformat() if when else '?'}")


@lifecycle_app.command("unarchive")
def unarchive(document: DocumentId, token: Token = None, tenant: Tenant = None, user: User = "dev",
              scopes: Scopes = None) -> None:
    """Bring an archived document back."""
    doc = _document_id(document)
    _run(token, tenant, user, scopes, lambda s: lifecycle.archive(s, doc, False))
    out.print(f"unarchived {doc}")


@lifecycle_app.command("mark-used")
def mark_used(document: DocumentId, token: Token = None, tenant: Tenant = None, user: User = "dev",
              scopes: Scopes = None) -> None:
    """Record that a document helped (one usage-ledger row; resets its lifecycle clock). Needs read only."""
    doc = _document_id(document)
    _run(token, tenant, user, scopes, lambda s: lifecycle.mark_used(s, doc, channel="cli"))
    out.print(f"marked {doc} as used")


@lifecycle_app.command("value")
def value(
    days: Annotated[int, typer.Option(help="the window, in days up to today")] = 30,
    limit: Annotated[int, typer.Option(help="at most this many items")] = 20,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """The items you can see, most used first (value_daily, as the usage job aggregated it)."""
    rows = _run(token, tenant, user, scopes, lambda s: lifecycle.value(s, days=days, limit=limit))
    for r in rows:
        typer.echo(f"{r.item_table}\t{r.item_id}\t{r.uses} uses\t{r.marks} marked used\t"
                   f"{r.days} days\tlast {r.last_day.isoformat()}")
    out.print(f"{len(rows)} items used in the last {days} days")


@derive_app.command("usage")
def usage(
    day: Annotated[str | None, typer.Option(help="day to aggregate (YYYY-MM-DD, default today UTC)")] = None,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Aggregate one day of the usage ledger into usage_daily and value_daily (idempotent)."""
    try:
        which = date.fromisoformat(day) if day else datetime.now(UTC).date()
    except ValueError:
        _fail(f"--day {day!r} is not YYYY-MM-DD", 2)
    rows, items = _run(token, tenant, user, scopes, lambda s: (
        lifecycle.aggregate_usage(s, which), lifecycle.refresh_value(s, which)), "usage")
    out.print(f"{which.isoformat()}: {rows} usage_daily rows written, {items} value_daily rows changed")


@derive_app.command("extract")
def extract_job(
    limit: Annotated[int | None, typer.Option(
        help="at most this many chunks in all (default: every chunk waiting)")] = None,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Extract entities, relations and dates from chunks not yet read (idempotent), with a progress bar.

    Runs of ENGRAM_DERIVE_EXTRACT_LIMIT chunks, each its own transaction, until none wait.
    """
    from orchestrator.cli.progress import progress_bar
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.db.session import bound_session
    from orchestrator.derive import poison
    from orchestrator.derive.extract import extract_all

    settings = Settings()
    try:
        identity = cli_identity(settings, token=token, tenant=tenant, user=user, scopes=scopes)
    except EngramError as exc:
        _fail(str(exc), 2)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)
    started_at = datetime.now(UTC)
    try:
        with progress_bar(err, "extracting", unit="chunks") as update:
            report = extract_all(lambda: bound_session(engine, identity), settings, limit=limit,
                                 on_progress=update)
        if report.skipped:
            poison.record_run(lambda: bound_session(engine, identity), "extract", ok=True,
                              line=report.line(), skipped=report.skipped, started_at=started_at,
                              keep_days=settings.derive_job_runs_keep_days)
    except BadInput as exc:
        _fail(str(exc), 2)
    except EngramError as exc:
        _fail(str(exc), 1)
    finally:
        engine.dispose()
    out.print(report.line())
    _show_skipped(report.skipped)
    if report.notice:
        err.print(styled("note:", "yellow", f" {report.notice}"))


@derive_app.command("communities")
def communities_job(
    full: Annotated[bool, typer.Option("--full", help="delete and rebuild every community")] = False,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Recluster the entity graph per scope set, every level; only changed communities are re-summarised."""
    from orchestrator.derive.communities import rebuild
    from orchestrator.derive.jobs import communities_line

    settings = Settings()
    with progress_bar(err, "communities") as bar:
        r = _run(token, tenant, user, scopes,
                 lambda s: rebuild(s, full=full, settings=settings, on_progress=bar), "communities")
    out.print(communities_line(r))


@derive_app.command("profiles")
def profiles_job(
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Build or refresh person, perspective and user profiles; unchanged input is not re-summarised."""
    from orchestrator.derive.jobs import profiles_line
    from orchestrator.derive.profiles import refresh

    settings = Settings()
    with progress_bar(err, "profiles") as bar:
        r = _run(token, tenant, user, scopes, lambda s: refresh(s, settings=settings, on_progress=bar),
                 "profiles")
    out.print(profiles_line(r))


@derive_app.command("raptor")
def raptor_job(
    full: Annotated[bool, typer.Option("--full", help="rebuild every tree from scratch")] = False,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Bring the RAPTOR trees up to date per scope set; only changed nodes and their ancestors are written."""
    from orchestrator.derive.raptor import build

    settings = Settings()
    with progress_bar(err, "summarising") as bar:
        r = _run(token, tenant, user, scopes,
                 lambda s: build(s, full=full, settings=settings, on_progress=bar), "raptor")
    out.print(f"{r.scope_sets} scope sets: {r.inserted} inserted, {r.updated} updated, {r.deleted} deleted, "
              f"{r.unchanged} unchanged; {r.resummarised} summarised, {r.joined} items joined a leaf, "
              f"{r.levels} levels")


# Consolidation, episodes, decision hooks, conflicts and the whole registry
# (orchestrator/derive/jobs.py); the worker runs the same jobs on a schedule.

def _outcome(token: str | None, tenant: str | None, user: str, scopes: str | None,
             name: str, **overrides: object) -> None:
    """Run one registry job; ``overrides`` (not None) replace settings for this run."""
    from orchestrator.derive.jobs import JOBS_BY_NAME, Outcome

    settings = Settings()
    given = {k: v for k, v in overrides.items() if v is not None}
    if given:
        settings = Settings(**{**settings.model_dump(), **given})
    job = JOBS_BY_NAME[name].run
    result = _run(token, tenant, user, scopes, lambda s: job(s, settings), name)
    assert isinstance(result, Outcome)
    out.print(result.line)
    for note in result.notes:
        err.print(styled("note:", "yellow", f" {note}"))


@derive_app.command("conflicts")
def conflicts_job(
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Detect conflicts among every claim you can read; prints how many are new."""
    _outcome(token, tenant, user, scopes, "conflicts")


@derive_app.command("consolidate")
def consolidate_job(
    min_evidence: Annotated[int | None, typer.Option(
        help="sources a statement needs to become an observation "
             "(default ENGRAM_DERIVE_CONSOLIDATE_MIN_EVIDENCE)")] = None,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Observations from corroborating claims, per scope set and perspective; only changes are written."""
    _outcome(token, tenant, user, scopes, "consolidate",
             derive_consolidate_min_evidence=min_evidence)


@derive_app.command("episodes")
def episodes_job(
    max_items: Annotated[int | None, typer.Option(
        help="items per episode (default ENGRAM_DERIVE_EPISODE_MAX_ITEMS)")] = None,
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Your working-memory sessions as private episodes; only sessions that grew are touched."""
    _outcome(token, tenant, user, scopes, "episodes",
             derive_episode_max_items=max_items)


@derive_app.command("decisions")
def decisions_job(
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Items marked as decisions become decision records with causal links (idempotent)."""
    _outcome(token, tenant, user, scopes, "decisions")


@derive_app.command("all")
def all_jobs(
    token: Token = None, tenant: Tenant = None, user: User = "dev", scopes: Scopes = None,
) -> None:
    """Run every derive job once, in order, for the token's tenant; one failing job does not stop the rest."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.db.session import bound_session
    from orchestrator.derive.jobs import JOBS, JobResult, run_jobs

    settings = Settings()
    try:
        identity = cli_identity(settings, token=token, tenant=tenant, user=user, scopes=scopes)
    except EngramError as exc:
        _fail(str(exc), 2)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)

    names = [j.name for j in JOBS]
    with progress_bar(err, names[0]) as bar:
        def show(r: JobResult) -> None:
            if r.ok:
                out.print(r.line if r.line.startswith(f"{r.job}:") else f"{r.job}: {r.line}")
            else:
                err.print(styled(f"{r.job}: failed:", "red", f" {r.line}"))
            for note in r.notes:
                err.print(styled("note:", "yellow", f" {r.job}: {note}"))
            done = names.index(r.job) + 1
            bar(done, len(names), names[done] if done < len(names) else "done")

        try:
            results = run_jobs(lambda: bound_session(engine, identity), settings, identity.org_id,
                               on_result=show)
        finally:
            engine.dispose()
    failed = [r for r in results if not r.ok]
    out.print(f"{len(results)} jobs in {sum(r.seconds for r in results):.1f}s: "
              f"{len(results) - len(failed)} ok, {len(failed)} failed")
    if failed:
        raise typer.Exit(1)
