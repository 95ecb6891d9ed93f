"""``engram``: the command line.

``engram up`` is what ``make up`` runs: start the embedded server (unless an
external one is configured), apply migrations and report how to connect.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Concatenate, NoReturn, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from orchestrator.cli.output import console, exit_status, styled
from orchestrator.config import Settings
from orchestrator.errors import EngramError, Unavailable, is_unavailable
from orchestrator.inputs import text_problem

if TYPE_CHECKING:
    from typer._click.core import Command  # typer's own click

    from orchestrator.db.engine import Database

P = ParamSpec("P")
T = TypeVar("T")

# The commands and command groups of their own modules, imported when one runs (or when the
# help lists them): `engram recall` imports the recall command and what it asks the API
# with, not the ingest, derive, audit and worker code and SQLAlchemy the others need (about a
# second of a two-second budget on a slow core, issue 17 item 5).
_LAZY: dict[str, tuple[str, str]] = {
    "serve": ("orchestrator.cli.serve", "serve"),
    "mcp": ("orchestrator.cli.serve", "mcp"),
    "ingest": ("orchestrator.cli.ingest", "ingest"),
    "remember": ("orchestrator.cli.ingest", "remember"),
    "recall": ("orchestrator.cli.recall", "recall_command"),
    "prepare": ("orchestrator.cli.recall", "prepare_command"),
    "trace": ("orchestrator.cli.recall", "trace_command"),
    "audit": ("orchestrator.cli.audit", "audit_app"),
    "auth": ("orchestrator.cli.auth", "auth_app"),
    "derive": ("orchestrator.cli.derive", "derive_app"),
    "lifecycle": ("orchestrator.cli.derive", "lifecycle_app"),
    "worker": ("orchestrator.cli.worker", "worker_app"),
    "models": ("orchestrator.cli.models", "models_app"),
    "rank": ("orchestrator.cli.rank", "rank_app"),
}


def _lazy_command(name: str) -> Command:
    """The click command of ``_LAZY[name]``, its module imported now."""
    module, attr = _LAZY[name]
    target = getattr(importlib.import_module(module), attr)
    if isinstance(target, typer.Typer):
        group = typer.main.get_group(target)
        group.name = name
        return group
    holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    holder.command(name)(target)
    return typer.main.get_command(holder)


class _CheckedArguments(TyperGroup):
    """Refuses a command line with text no command could use (a NUL, or a lone surrogate:
    bytes that are not UTF-8 reach Python as those) before any command runs, by the same
    rules as every other entry point (``orchestrator.inputs``); the commands of ``_LAZY``
    are imported when asked for."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        for n, arg in enumerate(args, 1):
            problem = text_problem(arg)
            if problem:
                console(stderr=True).print(styled("error:", "red", f" argument {n} {problem}"))
                raise typer.Exit(2)
        return super().parse_args(ctx, args)

    def list_commands(self, ctx: Any) -> list[str]:
        listed = super().list_commands(ctx)
        return [*listed, *(name for name in _LAZY if name not in listed)]

    def get_command(self, ctx: Any, cmd_name: str) -> Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in _LAZY:
            found = _lazy_command(cmd_name)
            self.add_command(found, cmd_name)
        return found


# Exit status of any command that could not reach the database (sysexits' EX_TEMPFAIL: retry).
EXIT_UNAVAILABLE = 75


class _EngramTyper(typer.Typer):
    """The CLI: a command that meets a database out of reach says so in one line (no host,
    no port, no traceback) and exits with ``EXIT_UNAVAILABLE``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            err.print(styled("error:", "red", f" {Unavailable.MESSAGE} ({Unavailable.code})"))
            sys.exit(EXIT_UNAVAILABLE)


app = _EngramTyper(help="Engram: a PostgreSQL-owned memory engine for AI agents.",
                   no_args_is_help=True, add_completion=False,
                   pretty_exceptions_enable=False, cls=_CheckedArguments)
db_app = typer.Typer(help="The database: embedded server lifecycle and migrations.",
                     no_args_is_help=True)
admin_app = typer.Typer(help="DBA tasks: tenants and scopes.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(admin_app, name="admin")

out = console()
err = console(stderr=True)


def _fail(message: str, code: int = 1) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(code)


def _database() -> Database:
    from orchestrator.db.engine import Database

    return Database(Settings())


def _embedded_only(db: Database, what: str) -> None:
    if db.external:
        _fail(f"`engram db {what}` manages the embedded server; ENGRAM_DATABASE_URL points at an "
              "external server, which Engram does not start or stop")


@db_app.command("start")
def db_start() -> None:
    """Start the embedded PostgreSQL server (creating it on first use)."""
    from orchestrator.db.server import AlreadyRunning

    db = _database()
    _embedded_only(db, "start")
    try:
        status = db.start_embedded()
    except AlreadyRunning as exc:
        out.print(str(exc))
        return
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"database {status.message}; data in {status.data_dir}")


@db_app.command("stop")
def db_stop() -> None:
    """Stop the embedded PostgreSQL server."""
    from orchestrator.db.server import NotRunning

    db = _database()
    _embedded_only(db, "stop")
    try:
        status = db.server.stop()
    except NotRunning as exc:
        out.print(f"{exc}; nothing to stop")
        return
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"database {status.message}")


@db_app.command("status")
def db_status() -> None:
    """Say whether the database runs, where, and at which migration. Exit 3 if stopped."""
    from orchestrator.db.migrate import current_revision, head_revision

    db = _database()
    if db.external:
        try:
            info = db.check_server()
            rev = current_revision(db.admin_url())
        except Exception as exc:  # a status command reports, it does not crash
            _fail(f"external database unreachable: {exc}", 3)
        out.print(f"external database: {info}; migration {rev or 'none'} (head {head_revision()})")
        return
    status = db.server.status()
    out.print(f"embedded database {status.message}; data in {status.data_dir}")
    if not status.running:
        raise typer.Exit(3)
    try:
        rev = current_revision(db.admin_url())
    except Exception as exc:  # a status command reports, it does not crash
        out.print(f"migration unknown ({str(exc).splitlines()[0]})")
        return
    out.print(f"migration {rev or 'none (run `engram db migrate`)'} (head {head_revision()})")


@db_app.command("url")
def db_url(
    role: Annotated[str, typer.Option(help="admin, engram_app or engram_auditor")] = "engram_app",
) -> None:
    """Print a connection URL (default: the application role)."""
    db = _database()
    try:
        url = db.psql_url(None if role == "admin" else role)
    except EngramError as exc:
        _fail(str(exc))
    out.print(url)


@db_app.command("psql", context_settings={"allow_extra_args": True,
                                          "ignore_unknown_options": True})
def db_psql(
    ctx: typer.Context,
    role: Annotated[str, typer.Option(help="admin, engram_app or engram_auditor")] = "admin",
) -> None:
    """Open psql on the database (extra arguments go to psql)."""
    db = _database()
    url = db.psql_url(None if role == "admin" else role)
    psql = str(db.server.client_bin("psql"))
    os.execvp(psql, [psql, url, *ctx.args])


@db_app.command("migrate")
def db_migrate(revision: Annotated[str, typer.Argument()] = "head") -> None:
    """Apply migrations up to REVISION (default head)."""
    from orchestrator.db.migrate import migrate

    db = _database()
    try:
        rev = migrate(db, revision)
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"database migrated to {rev}")


def _run_index_steps(engine: Any, steps: list[Any], label: str) -> list[tuple[str, float]]:
    """``indexes.run`` behind a progress bar fed by ``pg_stat_progress_create_index``."""
    from orchestrator.cli.progress import progress_bar
    from orchestrator.db import indexes

    with progress_bar(err, label, transient=True) as update:
        def on_progress(index: str, done: int, total: int, phase: str) -> None:
            update(done, total, f"{index}: {phase}")

        return indexes.run(engine, steps, on_progress)


@db_app.command("reindex")
def db_reindex(
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="say what would be rebuilt, change nothing")] = False,
) -> None:
    """Rebuild the vector and text indexes without blocking reads or writes (docs/database.md).

    pgvector tier: REINDEX CONCURRENTLY of every HNSW and GIN index. VectorChord tier: the
    same, and the vchordrq index rebuilt with lists sized from the table when they no
    longer fit (plus the matching vchordrq.probes for the app and worker roles).
    """
    from sqlalchemy import create_engine

    from orchestrator.db import indexes

    db = _database()
    engine = create_engine(db.admin_url())
    try:
        with engine.connect() as conn:
            tier = indexes.index_tier(conn)
            steps = indexes.plan(conn)
        out.print(f"index tier {tier}: {len(steps)} indexes")
        for step in steps:
            out.print(f"  {step.index} ({step.method}): {step.reason}")
        if dry_run:
            for step in steps:
                for statement in step.statements:
                    out.print(f"    {statement.splitlines()[0]}")
            return
        timings = _run_index_steps(engine, steps, "reindex")
    except EngramError as exc:
        _fail(str(exc))
    except Exception as exc:  # a failed REINDEX CONCURRENTLY leaves an invalid copy to drop
        _fail(f"reindex stopped: {str(exc).splitlines()[0]} (run it again: the invalid index a "
              "failed concurrent build leaves behind is dropped first)")
    finally:
        engine.dispose()
    for index, seconds in timings:
        out.print(f"rebuilt {index} in {seconds:.1f}s")


@db_app.command("tenant-index")
def db_tenant_index(
    org: Annotated[str | None, typer.Argument(
        help="the tenant (organization id); none: list the tenants and their indexes")] = None,
    drop: Annotated[bool, typer.Option("--drop", help="drop the tenant's own indexes")] = False,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="say what would be done, change nothing")] = False,
) -> None:
    """Give a large tenant its own vector indexes (pgvector tier; docs/database.md).

    One HNSW graph per table holds every tenant's rows; a tenant with a large share of a
    large corpus loses part of its exact top 40 to the filter. Its own (partial) indexes,
    one beside each shared one, hold only its rows: built CONCURRENTLY, used by recall
    within `recall_size_ttl_s`.
    """
    from sqlalchemy import create_engine

    from orchestrator.db import indexes

    if org is None and drop:
        _fail("--drop needs the tenant: engram db tenant-index ORG --drop")
    db = _database()
    engine = create_engine(db.admin_url())
    timings: list[tuple[str, float]] = []
    try:
        with engine.connect() as conn:
            if org is None:
                found = indexes.tenant_indexes(conn)
                live = len(indexes.live_vector_indexes(conn))
                total = sum(t.chunks for t in found) or 1
                out.print(f"{len(found)} tenants, {total:,} embedded chunks, {live} shared "
                          "vector indexes")
                for t in found:
                    own = "-"
                    if t.own:
                        invalid = sum(not x.valid for x in t.own.values())
                        size = sum(x.size_bytes for x in t.own.values())
                        own = (f"{len(t.own)} of {live} ({size / 2**20:.1f} MiB"
                               f"{f', {invalid} INVALID: run this command again' if invalid else ''})")
                    worth = (" <- worth its own indexes" if not t.own
                             and indexes.worth_own_indexes(t.chunks, total) else "")
                    out.print(f"  {t.org}: {t.chunks:,} chunks ({t.chunks / total:.1%}), "
                              f"own indexes {own}{worth}")
                out.print(f"a tenant's own indexes pay off from about "
                          f"{indexes.TENANT_INDEX_WORTH_CHUNKS:,} chunks that are a tenth or "
                          "more of the corpus (docs/database.md)")
                return
            steps = indexes.tenant_index_steps(conn, org, drop=drop)
        if not steps:
            out.print(f"tenant '{org}' " + ("has no own vector index: nothing to drop" if drop
                                            else "already has its own vector indexes: nothing "
                                                 "to build"))
            return
        for step in steps:
            out.print(f"{step.index}: {step.reason}")
            if dry_run:
                for statement in step.statements:
                    out.print(f"  {statement}")
        if dry_run:
            return
        timings = _run_index_steps(engine, steps, "tenant index")
    except EngramError as exc:
        _fail(str(exc))
    except Exception as exc:  # a failed concurrent build leaves an invalid index behind
        _fail(f"tenant index stopped: {str(exc).splitlines()[0]} (run it again: what is built "
              "stays; the invalid index a failed concurrent build leaves behind is dropped "
              "first)")
    finally:
        engine.dispose()
    for index, seconds in timings:
        out.print(f"{'dropped' if drop else 'built'} {index} in {seconds:.1f}s")
    out.print("recall uses the change within recall_size_ttl_s")


@db_app.command("reset")
def db_reset(
    yes: Annotated[bool, typer.Option("--yes", help="do not ask")] = False,
) -> None:
    """Delete the embedded cluster and all its data (asks first)."""
    db = _database()
    _embedded_only(db, "reset")
    if not yes:
        if not sys.stdin.isatty():
            _fail("refusing to delete the database without --yes when not on a terminal")
        typer.confirm(f"Delete every Engram row in {db.server.data_dir}?", abort=True)
    db.server.reset()
    out.print(f"embedded database deleted ({db.server.data_dir})")


def _dba(task: Callable[Concatenate[Database, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``task(database, *args)`` (an ``orchestrator.admin`` function); a refusal is printed
    and exits (2 for a value that was wrong, 1 for anything else)."""
    try:
        return task(_database(), *args, **kwargs)
    except EngramError as exc:
        _fail(str(exc), exit_status(exc))


@admin_app.command("create-tenant")
def admin_create_tenant(org_id: str, name: Annotated[str, typer.Option()] = "") -> None:
    """Create a tenant for an organization id."""
    from orchestrator import admin

    tenant = _dba(admin.create_tenant, org_id, name or org_id)
    out.print(f"tenant {org_id} created ({tenant})")


@admin_app.command("create-scope")
def admin_create_scope(org_id: str, name: str,
                       description: Annotated[str, typer.Option()] = "") -> None:
    """Create a scope in a tenant."""
    from orchestrator import admin

    scope = _dba(admin.create_scope, org_id, name, description)
    out.print(f"scope {name} created in {org_id} ({scope})")


@admin_app.command("tenants")
def admin_tenants() -> None:
    """List the tenants: organization id, name, scopes, created."""
    from rich.table import Table

    from orchestrator import admin

    found = _dba(admin.tenants)
    if not found:
        out.print("no tenants yet: engram admin create-tenant ORG --name NAME")
        return
    table = Table("organization id", "name", "scopes", "created")
    for t in found:
        table.add_row(t.org_id, t.name, str(t.scopes), f"{t.created_at:%Y-%m-%d %H:%M}")
    out.print(table)


@admin_app.command("scopes")
def admin_scopes(org_id: str) -> None:
    """List a tenant's scopes: name, description, created, the tables holding their rows."""
    from rich.table import Table

    from orchestrator import admin

    found = _dba(admin.scopes, org_id)
    if not found:
        out.print(f"no scopes in {org_id} yet: engram admin create-scope {org_id} NAME "
                  "--description TEXT")
        return
    table = Table("scope", "description", "created", "rows shared into it")
    for sc in found:
        table.add_row(sc.name, sc.description, f"{sc.created_at:%Y-%m-%d %H:%M}",
                      ", ".join(sc.holders) or "none (delete-scope would delete it)")
    out.print(table)


@admin_app.command("rename-tenant")
def admin_rename_tenant(org_id: str, name: str) -> None:
    """Change a tenant's name (its organization id, which tokens carry, stays)."""
    from orchestrator import admin

    _dba(admin.rename_tenant, org_id, name)
    out.print(f"tenant {org_id} is named {name!r}")


@admin_app.command("rename-scope")
def admin_rename_scope(org_id: str, name: str, new_name: str) -> None:
    """Rename a scope. Its rows stay in it; tokens must name the new name from now on."""
    from orchestrator import admin

    _dba(admin.rename_scope, org_id, name, new_name)
    out.print(f"scope {name} of {org_id} is now {new_name}: tokens grant it as read:{new_name} "
              f"and write:{new_name}; a token that names {name} is refused until it is issued again")


@admin_app.command("describe-scope")
def admin_describe_scope(org_id: str, name: str, description: str) -> None:
    """Set a scope's description (what it is for)."""
    from orchestrator import admin

    _dba(admin.describe_scope, org_id, name, description)
    out.print(f"scope {name} of {org_id} described")


@admin_app.command("delete-scope")
def admin_delete_scope(org_id: str, name: str) -> None:
    """Delete a scope that no row is shared into (refused, naming the tables, while one is)."""
    from orchestrator import admin

    _dba(admin.delete_scope, org_id, name)
    out.print(f"scope {name} deleted from {org_id}")


@app.command("up")
def up(
    serve_api: Annotated[bool, typer.Option(
        "--serve/--no-serve", help="then run the worker and the API until interrupted")] = True,
) -> None:
    """Start the embedded database (unless external), migrate, then run the worker and the API."""
    from orchestrator.db.migrate import migrate
    from orchestrator.db.server import AlreadyRunning

    db = _database()
    try:
        if not db.external:
            try:
                status = db.start_embedded()
                out.print(f"database {status.message}")
            except AlreadyRunning as exc:
                out.print(str(exc))
        rev = migrate(db)
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"database migrated to {rev}")
    # The password stays out of what `up` prints: its output is a service's log.
    hidden = db.psql_url("engram_app", hide_password=True)
    out.print("connect as the application role (`engram db url` prints it with its password):")
    out.print(f"  {hidden}")
    out.print("or open psql as the administrator: engram db psql")
    if serve_api:
        from orchestrator.cli.serve import serve_engram

        try:
            serve_engram(Settings())
        finally:
            if not db.external:
                # Interrupted or stopped: the database is a process of its own, which the CLI
                # (ingest, recall, db psql) keeps using; say that it runs and how to stop it.
                out.print("API and worker stopped; the embedded database keeps running "
                          "(`engram db stop` stops it)")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
