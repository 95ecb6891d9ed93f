"""``engram rank``: train a tenant's ranking model from its usage, show models, activate one.

Training reads every user's usage rows and feedback of a tenant, so it runs as
the derive service identity (``auth.bind_service_identity``, reached through
the worker role's tenant list, exactly as ``engram worker run`` does), never as
a token's user: ``engram rank train`` is an operator's command. ``train``
evaluates the new model on the newest held-back slice of the tenant's history
beside the active model (or the packaged default) and fused order, prints the
figures side by side, and activates it only when it wins there (``--activate
always|never`` to override). ``status`` lists the tenant's models, their
training sizes and figures, the events with feedback waiting, and the packaged
default. Exit status: 0 on success, 1 when a tenant failed, 2 for bad input.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, NoReturn

import typer
from rich.table import Table

from orchestrator.cli.output import console, styled
from orchestrator.cli.progress import progress_bar
from orchestrator.config import Settings
from orchestrator.derive.service import ServiceTenant, service_session, service_tenants
from orchestrator.errors import BadInput, EngramError

rank_app = typer.Typer(help="Learned ranking: train from usage, status, activate.",
                       no_args_is_help=True)
out = console()
err = console(stderr=True)

TenantOpt = Annotated[str | None, typer.Option("--tenant", help="organization id (default: every tenant)")]


def _fail(message: str, code: int) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(code)


def _tenants(settings: Settings, only: str | None) -> list[ServiceTenant]:
    from orchestrator.db.engine import Database, make_app_engine

    worker = make_app_engine(Database(settings).role_url("engram_worker"), pool_size=1)
    try:
        with worker.connect() as conn:
            tenants = service_tenants(conn)
    finally:
        worker.dispose()
    if only is not None:
        tenants = [t for t in tenants if t.org_id == only]
        if not tenants:
            _fail(f"no tenant {only!r}", 2)
    return tenants


def _since(value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        _fail(f"--since {value!r} is not an ISO 8601 moment", 2)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@rank_app.command("train")
def train_command(
    tenant: TenantOpt = None,
    since: Annotated[str | None, typer.Option(help="only usage from this moment on (ISO 8601)")] = None,
    activate: Annotated[str, typer.Option(help="if-better (default), always or never")] = "if-better",
    rounds: Annotated[int | None, typer.Option(help="boosting rounds (default 100)")] = None,
) -> None:
    """Train each tenant's model from its usage rows and mark_used feedback (see --help of rank)."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall.learning import train_tenant

    if activate not in ("if-better", "always", "never"):
        _fail(f"--activate must be if-better, always or never, not {activate!r}", 2)
    if rounds is not None and not 1 <= rounds <= 5000:
        _fail(f"--rounds must be between 1 and 5000, not {rounds}", 2)
    settings = Settings()
    moment = _since(since)
    tenants = _tenants(settings, tenant)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)
    failed = 0
    try:
        with progress_bar(err, "training", unit="tenants") as update:
            for done, t in enumerate(tenants):
                update(done, len(tenants), f"training {t.org_id}")
                try:
                    with service_session(engine, t) as session:
                        report = train_tenant(session, t.org_id, settings,
                                              since=moment, activate=activate, rounds=rounds)
                except BadInput as exc:
                    _fail(str(exc), 2)
                except EngramError as exc:
                    err.print(f"{t.org_id}: {exc}", style="red")
                    failed += 1
                    continue
                for line in report.lines():
                    out.print(line)
            update(len(tenants), len(tenants))
    finally:
        engine.dispose()
    if failed:
        raise typer.Exit(1)


@rank_app.command("status")
def status_command(tenant: TenantOpt = None) -> None:
    """The packaged default model, and per tenant its models and the feedback waiting."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall.learning import status

    settings = Settings()
    tenants = _tenants(settings, tenant)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)
    try:
        default_shown = False
        for t in tenants:
            with service_session(engine, t) as session:
                report = status(session)
            if not default_shown:
                out.print(f"packaged default model: {report.default}")
                default_shown = True
            out.print(f"tenant {t.org_id}: {report.events} recall(s) and prepare(s) recorded"
                      + ("" if report.models else "; no trained model (the default ranks)"))
            if report.models:
                table = Table("version", "active", "trained", "events", "rows", "positives",
                              "held-back nDCG@10", "sha256")
                for m in report.models:
                    table.add_row(f"v{m['version']}", "yes" if m["active"] else "",
                                  m["trained_at"].strftime("%Y-%m-%d %H:%M"), str(m["events"]),
                                  str(m["rows"]), str(m["positives"]),
                                  ", ".join(f"{k} {v}" for k, v in m["metrics"].items()), m["sha256"])
                out.print(table)
    except EngramError as exc:
        _fail(str(exc), 1)
    finally:
        engine.dispose()


@rank_app.command("activate")
def activate_command(
    version: Annotated[int, typer.Argument(help="the stored model version to activate")],
    tenant: Annotated[str, typer.Option("--tenant", help="organization id")],
) -> None:
    """Make a stored model the tenant's active one (a rollback is activating an older one)."""
    from orchestrator.db.engine import Database, make_app_engine
    from orchestrator.recall.learning import activate_version

    settings = Settings()
    (t,) = _tenants(settings, tenant)
    engine = make_app_engine(Database(settings).app_url(), pool_size=1)
    try:
        with service_session(engine, t) as session:
            activate_version(session, version)
    except EngramError as exc:
        _fail(str(exc), 1)
    finally:
        engine.dispose()
    out.print(f"tenant {tenant}: model v{version} is active")
