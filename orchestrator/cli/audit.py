"""``engram audit``: the auditor's commands.

Every command connects as ``engram_auditor``, which reads the provenance schema
of every tenant and nothing else; row content never reaches an auditor, only
keys and hashes. Tenants are named by organization id or by tenant id.
Exit status: 0 when everything checked is intact, 1 when something is broken,
2 for bad input.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from sqlalchemy import Connection, create_engine, pool, text

from orchestrator.cli.output import console, styled
from orchestrator.config import Settings
from orchestrator.db.engine import Database
from orchestrator.errors import BadInput, EngramError, NotFound

audit_app = typer.Typer(help="Auditors: verify and anchor the provenance chain, export PROV-O, "
                             "check recall receipts, trace lineage.", no_args_is_help=True)
out = console()
err = console(stderr=True)


def _fail(message: str, code: int = 2) -> NoReturn:
    err.print(styled("error:", "red", f" {message}"))
    raise typer.Exit(code)


@contextmanager
def auditor() -> Iterator[Connection]:
    engine = create_engine(Database(Settings()).role_url("engram_auditor"), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            yield conn
    finally:
        engine.dispose()


def resolve_tenant(conn: Connection, name: str) -> uuid.UUID:
    try:
        return uuid.UUID(name)
    except ValueError:
        pass
    found = conn.execute(text("select id from auth.tenants where org_id = :o"), {"o": name}).scalar()
    if found is None:
        raise NotFound(f"no tenant for organization {name!r}")
    tenant: uuid.UUID = found
    return tenant


def _org_names(conn: Connection) -> dict[uuid.UUID, str]:
    return {r.id: r.org_id for r in conn.execute(text("select id, org_id from auth.tenants")).all()}


def _short(digest: bytes | None) -> str:
    return digest.hex() if digest is not None else "-"


@audit_app.command("verify")
def verify_cmd(
    tenant: Annotated[str | None, typer.Option(help="organization id or tenant id (default: all)")] = None,
    from_seq: Annotated[int, typer.Option("--from", help="first sequence number to check")] = 1,
    rows: Annotated[bool, typer.Option(help="also compare current rows with the chain")] = True,
    anchors: Annotated[Path | None, typer.Option(
        "--anchors", "--anchors-from", help="a file written by `engram audit anchor --out` (kept "
        "outside the database): each anchored event must still have its hash")] = None,
    strict: Annotated[bool, typer.Option(
        "--strict", help="exit 1 on warnings too (events by a role other than Engram's writers, "
        "events no anchor covers)")] = False,
) -> None:
    """Recompute the chain; report the first broken link per tenant, or OK with counts and head.

    Also warns about events written by a role other than Engram's writers (engram_app,
    engram_worker), naming it, and, with --anchors, about events after a tenant's last
    anchor, which no anchor vouches for."""
    from orchestrator.audit.chain import check_anchors, parse_anchors, unanchored, verify

    broken = warned = False
    try:
        with auditor() as conn:
            tid = resolve_tenant(conn, tenant) if tenant else None
            names = _org_names(conn)
            reports = verify(conn, tid, from_seq=from_seq, rows=rows)
            if tid is not None and not reports:
                out.print(f"OK {tenant}: no events yet")
            for rep in reports:
                label = f"{names.get(rep.tenant_id, '(deleted tenant)')} ({rep.tenant_id})"
                if rep.chain_break is None:
                    out.print(f"OK {label}: {rep.checked} events checked from seq {from_seq}, "
                              f"head seq {rep.head_seq} hash {_short(rep.head_hash)}")
                else:
                    broken = True
                    b = rep.chain_break
                    out.print(f"BROKEN {label}: at event {b.seq}: {b.problem}; expected "
                              f"{_short(b.expected_hash)} found {_short(b.found_hash)}")
                for p in rep.row_problems:
                    broken = True
                    out.print(f"ROW {label}: {p.table_name} {json.dumps(p.row_id)}: {p.problem} "
                              f"(latest event {p.event_seq}; expected {_short(p.expected_hash)} "
                              f"found {_short(p.found_hash)})")
                for w in rep.warnings:
                    warned = True
                    out.print(f"WARNING {label}: {w}")
            if anchors is not None:
                try:
                    lines = anchors.read_text().splitlines()
                except OSError as exc:
                    raise BadInput(f"cannot read {anchors}: {exc.strerror}") from exc
                parsed = parse_anchors(lines)
                for chk in check_anchors(conn, parsed):
                    if chk.ok:
                        out.print(f"ANCHOR OK {chk.tenant_id} seq {chk.seq}")
                    else:
                        broken = True
                        out.print(f"ANCHOR BROKEN {chk.tenant_id} seq {chk.seq}: {chk.problem}")
                for gap in unanchored(conn, parsed, tid):
                    warned = True
                    out.print(f"NOT ANCHORED {names.get(gap.tenant_id, '(deleted tenant)')} "
                              f"({gap.tenant_id}): {gap}")
    except EngramError as exc:
        _fail(str(exc))
    if broken or (strict and warned):
        raise typer.Exit(1)


@audit_app.command("dump")
def dump_cmd(
    tenant: Annotated[str, typer.Option(help="organization id or tenant id")],
    from_seq: Annotated[int, typer.Option("--from", help="first sequence number")] = 1,
    output: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
) -> None:
    """Write a tenant's events as JSON lines, to verify offline with `engram audit verify-file`."""
    from orchestrator.audit.canonical import event_to_json
    from orchestrator.audit.chain import events

    if from_seq < 1:
        _fail(f"--from must be 1 or more, not {from_seq}")
    try:
        with auditor() as conn:
            evs = events(conn, resolve_tenant(conn, tenant), from_seq=from_seq)
    except EngramError as exc:
        _fail(str(exc))
    lines = [json.dumps(event_to_json(e), ensure_ascii=False) + "\n" for e in evs]
    if output is None:
        typer.echo("".join(lines), nl=False)
    else:
        output.write_text("".join(lines))
        out.print(f"wrote {len(lines)} events to {output}")


@audit_app.command("verify-file")
def verify_file_cmd(
    path: Annotated[Path, typer.Argument(help="a file written by `engram audit dump`")],
) -> None:
    """Recompute chains from a dump, without the database: Python code that shares nothing with it."""
    from orchestrator.audit.canonical import GENESIS, ChainEvent, event_from_json, verify_offline

    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror}")
    by_tenant: dict[uuid.UUID, list[ChainEvent]] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            ev = event_from_json(line)
        except (ValueError, KeyError, TypeError) as exc:
            _fail(f"line {n} is not a chain event ({exc})")
        by_tenant.setdefault(ev.tenant_id, []).append(ev)
    broken = False
    for tenant, evs in by_tenant.items():
        evs.sort(key=lambda e: e.seq)
        first = evs[0]
        # A dump that starts later than 1 is trusted up to its first event's prev_hash.
        prev = GENESIS if first.seq == 1 else first.prev_hash
        brk = verify_offline(evs, prev=prev, first_seq=first.seq)
        if brk is None:
            out.print(f"OK {tenant}: {len(evs)} events from seq {first.seq}, head seq {evs[-1].seq} "
                      f"hash {evs[-1].hash.hex()}")
        else:
            broken = True
            out.print(f"BROKEN {tenant}: at event {brk.seq}: {brk.problem}; expected "
                      f"{_short(brk.expected)} found {_short(brk.found)}")
    if broken:
        raise typer.Exit(1)


@audit_app.command("anchor")
def anchor_cmd(
    tenant: Annotated[str | None, typer.Option(help="organization id or tenant id (default: all)")] = None,
    output: Annotated[Path | None, typer.Option("--out", help="also append the anchors to this file")] = None,
) -> None:
    """Print each tenant's head (seq and hash) as JSON lines, to keep outside the database."""
    from orchestrator.audit.chain import heads

    try:
        with auditor() as conn:
            tid = resolve_tenant(conn, tenant) if tenant else None
            lines = [json.dumps(h.to_json()) for h in heads(conn, tid)]
    except EngramError as exc:
        _fail(str(exc))
    for line in lines:
        out.print(line)
    if output is not None:
        with output.open("a") as fh:
            fh.writelines(line + "\n" for line in lines)


@audit_app.command("export")
def export_cmd(
    tenant: Annotated[str, typer.Option(help="organization id or tenant id")],
    fmt: Annotated[str, typer.Option("--format", help="jsonld or ttl")] = "jsonld",
    output: Annotated[Path | None, typer.Option("--out", help="write here instead of stdout")] = None,
) -> None:
    """Write the tenant's provenance as W3C PROV-O (JSON-LD or Turtle)."""
    from orchestrator.audit.export import export

    if fmt not in ("jsonld", "ttl"):
        _fail(f"--format must be jsonld or ttl, not {fmt!r}")
    try:
        with auditor() as conn:
            doc = export(conn, resolve_tenant(conn, tenant), fmt)  # type: ignore[arg-type]
    except EngramError as exc:
        _fail(str(exc))
    if output is None:
        typer.echo(doc)
    else:
        output.write_text(doc)
        out.print(f"wrote {output}")


@audit_app.command("receipt")
def receipt_cmd(
    receipt_id: Annotated[str, typer.Argument(help="the receipt's id")],
    rendered: Annotated[Path | None, typer.Option(help="a file with the rendered text to compare")] = None,
) -> None:
    """Re-derive a recall receipt from the stored evidence versions; say whether it matches."""
    from orchestrator.audit.receipts import verify_receipt

    try:
        rid = uuid.UUID(receipt_id)
    except ValueError:
        _fail(f"{receipt_id!r} is not a receipt id (a UUID)")
    try:
        with auditor() as conn:
            text = rendered.read_text() if rendered else None
            chk = verify_receipt(conn, rid, rendered=text)
            if chk.rendered_ok is False and text and text.endswith("\n"):
                # `engram recall ... > FILE` ends the printed string with a line break.
                chk = chk.with_rendered(text[:-1])
    except OSError as exc:
        _fail(f"cannot read {rendered}: {exc.strerror}")
    except EngramError as exc:
        _fail(str(exc))
    out.print(f"receipt {chk.id}: asked by {chk.asked_by} at {chk.asked_at.isoformat()}")
    for e in chk.evidence:
        out.print(f"  {e.status:9} {e.table} {json.dumps(e.row_id)} served {e.served.hex()}")
    if chk.ok:
        out.print("MATCHES: the seal, the chain and every evidence version agree")
        return
    if chk.proven:
        # Genuine as served; rows were edited (or their access counters bumped) since.
        out.print("PROVEN: the seal, the chain and every served version agree; changed since:")
        for p in chk.problems():
            out.print(f"  {p}")
        return
    if chk.queued and chk.seal_ok and chk.rendered_ok is not False:
        out.print("NOT YET CHAINED: the seal agrees; the receipt's chain event waits in "
                  "provenance.receipt_queue (the recalling process or `engram worker run` appends "
                  "it within seconds); ask again to prove it")
        raise typer.Exit(1)
    for p in chk.problems():
        out.print(f"DOES NOT MATCH: {p}")
    raise typer.Exit(1)


@audit_app.command("lineage")
def lineage_cmd(
    tenant: Annotated[str, typer.Option(help="organization id or tenant id")],
    table: Annotated[str, typer.Argument(help="schema.table, e.g. sources.chunks")],
    row_id: Annotated[str, typer.Argument(
        help='the row id: a UUID (the id column) or JSON, e.g. {"id": "..."}')],
    forward: Annotated[bool, typer.Option("--forward", help="what was derived from the row")] = False,
) -> None:
    """Trace a row to its origins (or forward), with the chain events proving each step."""
    from orchestrator.audit.lineage import lineage

    try:
        rid = {"id": str(uuid.UUID(row_id))}
    except ValueError:
        try:
            rid = json.loads(row_id)
        except ValueError:
            _fail(f"row id {row_id!r} is neither a UUID nor JSON (e.g. {{\"id\": \"...\"}})")
    if not isinstance(rid, dict):
        _fail('a row id is a UUID or a JSON object, e.g. {"id": "..."}')
    try:
        with auditor() as conn:
            lin = lineage(conn, resolve_tenant(conn, tenant), table, rid,
                          direction="forward" if forward else "back")
    except EngramError as exc:
        _fail(str(exc))
    for e in lin.edges:
        src = f"{e.source[0]} {e.source[1]}" if e.source else f"agent {e.source_agent_id}"
        proof = f"event {e.event.seq}" if e.event else "NOT IN CHAIN"
        out.print(f"{'  ' * (e.depth - 1)}{e.derived[0]} {e.derived[1]} {e.relation} {src} ({proof})")
    if not lin.edges:
        out.print("no derivation recorded for this row")
    if not lin.proven():
        out.print("NOT PROVEN: an edge or a version is missing from the chain")
        raise typer.Exit(1)
