"""``engram audit``: verify, anchor, export, receipt and lineage as an auditor would run them."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rdflib import Graph
from sqlalchemy import Engine, select
from typer.testing import CliRunner

from orchestrator.audit.lineage import record_derivation
from orchestrator.audit.receipts import append_receipt
from orchestrator.cli.main import app
from orchestrator.config import Settings
from orchestrator.db.models import Chunk
from orchestrator.db.session import bound_session
from tests.conftest import TenantFixture
from tests.support.provenance import as_superuser, put

TenantMaker = Callable[..., TenantFixture]
runner = CliRunner()


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the CLI's own Settings() at the test database."""
    monkeypatch.setenv("ENGRAM_HOME", str(settings.home))
    monkeypatch.setenv("ENGRAM_DB_PORT", str(settings.db_port))
    monkeypatch.setenv("ENGRAM_DB_NAME", settings.db_name)
    if settings.database_url:
        monkeypatch.setenv("ENGRAM_DATABASE_URL", settings.database_url)
        monkeypatch.setenv("ENGRAM_AUDITOR_PASSWORD", settings.auditor_password or "")


def test_verify_anchor_and_tamper(cli_env: None, app_engine: Engine, admin_engine: Engine,
                                  tenant_factory: TenantMaker, tmp_path: Path) -> None:
    t = tenant_factory("team")
    put(app_engine, t, "a.md")
    put(app_engine, t, "b.md")
    res = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id])
    assert res.exit_code == 0, res.output
    assert res.output.startswith(f"OK {t.org_id} ({t.id}):")
    anchors = tmp_path / "anchors.jsonl"
    res = runner.invoke(app, ["audit", "anchor", "--tenant", t.org_id, "--out", str(anchors)])
    assert res.exit_code == 0, res.output
    (line,) = anchors.read_text().splitlines()
    anchored = json.loads(line)
    assert anchored["tenant_id"] == str(t.id) and anchored["seq"] >= 4
    res = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id, "--anchors", str(anchors)])
    assert res.exit_code == 0 and f"ANCHOR OK {t.id} seq {anchored['seq']}" in res.output

    as_superuser(admin_engine, "update provenance.events set operation = 'UPDATE' "
                               "where tenant_id = :t and seq = 2", {"t": t.id})
    res = runner.invoke(app, ["audit", "verify", "--tenant", t.org_id, "--anchors", str(anchors)])
    assert res.exit_code == 1
    assert "BROKEN" in res.output and "at event 2:" in res.output and "altered" in res.output
    assert "ANCHOR BROKEN" not in res.output, "the anchored head itself was not touched"


def test_bad_input_exits_2(cli_env: None, tmp_path: Path) -> None:
    res = runner.invoke(app, ["audit", "verify", "--tenant", "no-such-org"])
    assert res.exit_code == 2 and "no tenant for organization 'no-such-org'" in res.output
    res = runner.invoke(app, ["audit", "verify", "--from", "0"])
    assert res.exit_code == 2 and "1 or more" in res.output
    res = runner.invoke(app, ["audit", "receipt", "not-a-uuid"])
    assert res.exit_code == 2 and "not a receipt id" in res.output
    res = runner.invoke(app, ["audit", "receipt", str(uuid.uuid4())])
    assert res.exit_code == 2 and "no receipt" in res.output
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    res = runner.invoke(app, ["audit", "verify", "--anchors", str(bad)])
    assert res.exit_code == 2 and "anchor line 1" in res.output
    res = runner.invoke(app, ["audit", "export", "--tenant", "x", "--format", "xml"])
    assert res.exit_code == 2 and "jsonld or ttl" in res.output
    res = runner.invoke(app, ["audit", "lineage", "--tenant", "x", "sources.chunks", "[1]"])
    assert res.exit_code == 2 and "JSON object" in res.output
    res = runner.invoke(app, ["audit", "lineage", "--tenant", "x", "sources.chunks", "chunk-7"])
    assert res.exit_code == 2 and "'chunk-7' is neither a UUID nor JSON" in res.output


def test_export_receipt_and_lineage(cli_env: None, app_engine: Engine, tenant_factory: TenantMaker,
                                    tmp_path: Path) -> None:
    t = tenant_factory("team")
    d = put(app_engine, t, "a.md")
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        chunk = s.execute(select(Chunk.id).where(Chunk.document_id == d)).scalars().first()
        record_derivation(s, ("sources.chunks", {"id": str(chunk)}), [("sources.documents", {"id": str(d)})],
                          relation="wasQuotedFrom")
        rid = append_receipt(s, "q?", [("sources.chunks", {"id": str(chunk)}, None)], "answer")
    # Sealed now, chained in a batch (0040): chain it before the auditor proves it (a background
    # chainer of this process may have done it already; chaining twice is a no-op).
    from orchestrator.audit.receipts import chain_receipts

    with app_engine.begin() as conn:
        chain_receipts(conn)
    out = tmp_path / "prov.ttl"
    res = runner.invoke(app, ["audit", "export", "--tenant", t.org_id, "--format", "ttl", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert len(Graph().parse(out, format="turtle")) > 10
    res = runner.invoke(app, ["audit", "export", "--tenant", str(t.id)])
    assert res.exit_code == 0 and len(Graph().parse(data=res.output, format="json-ld")) > 10

    rendered = tmp_path / "rendered.txt"
    rendered.write_text("answer")
    res = runner.invoke(app, ["audit", "receipt", str(rid), "--rendered", str(rendered)])
    assert res.exit_code == 0 and "MATCHES" in res.output and "unchanged" in res.output, res.output
    rendered.write_text("another answer")
    res = runner.invoke(app, ["audit", "receipt", str(rid), "--rendered", str(rendered)])
    assert res.exit_code == 1 and "rendered text given does not match" in res.output

    res = runner.invoke(app, ["audit", "lineage", "--tenant", t.org_id, "sources.chunks",
                              json.dumps({"id": str(chunk)})])
    assert res.exit_code == 0, res.output
    assert "wasQuotedFrom sources.documents" in res.output and str(d) in res.output
    assert "(event " in res.output
    # A bare UUID is the row's id column: the same lineage.
    bare = runner.invoke(app, ["audit", "lineage", "--tenant", t.org_id, "sources.chunks",
                               str(chunk)])
    assert bare.exit_code == 0 and bare.output == res.output, bare.output


def test_dump_and_verify_offline(cli_env: None, app_engine: Engine, tenant_factory: TenantMaker,
                                 tmp_path: Path) -> None:
    t = tenant_factory("team")
    put(app_engine, t, "a.md", "Ünïcode \"quoted\" body. " * 30)
    put(app_engine, t, "b.md")
    dump = tmp_path / "events.jsonl"
    res = runner.invoke(app, ["audit", "dump", "--tenant", t.org_id, "--out", str(dump)])
    assert res.exit_code == 0, res.output
    lines = dump.read_text().splitlines()
    res = runner.invoke(app, ["audit", "verify-file", str(dump)])
    assert res.exit_code == 0 and res.output.startswith(f"OK {t.id}: {len(lines)} events"), res.output
    # Edit one event in the file: the offline check points at it.
    third = json.loads(lines[2])
    third["actor_user"] = "mallory"
    lines[2] = json.dumps(third)
    dump.write_text("\n".join(lines) + "\n")
    res = runner.invoke(app, ["audit", "verify-file", str(dump)])
    assert res.exit_code == 1 and f"BROKEN {t.id}: at event 3:" in res.output
    # Drop an event: a gap.
    dump.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    res = runner.invoke(app, ["audit", "verify-file", str(dump)])
    assert res.exit_code == 1 and "event 2 is missing" in res.output
    dump.write_text("garbage\n")
    res = runner.invoke(app, ["audit", "verify-file", str(dump)])
    assert res.exit_code == 2 and "line 1 is not a chain event" in res.output
