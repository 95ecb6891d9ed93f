"""``engram recall``, ``engram prepare`` and ``engram trace`` through the real CLI."""

from __future__ import annotations

from typer.testing import CliRunner

from orchestrator.cli.main import app
from tests.support.derive import cli_env
from tests.support.recall import doc, embedder, write_documents

__all__ = ["cli_env", "embedder"]


def test_recall_prepare_and_trace_as_a_user(cli_env, tenant_factory, app_engine, embedder, settings):
    t = tenant_factory("team", "exec")
    write_documents(app_engine, t.identity(write=("team", "exec")), embedder, [
        doc("roof.md", "Roof repair", "Three quotes for the roof; the cheapest is Dakwerk at 4,200 euros."),
        doc("board.md", "Board memo", "The roof budget is capped at 5,000 euros.", scopes=("exec",)),
    ], settings)
    runner = CliRunner()
    who = ["--org", t.org_id, "--as", "alice", "--read", "team"]
    recalled = runner.invoke(app, ["recall", "how much will the roof cost?", *who], env=cli_env)
    assert recalled.exit_code == 0, recalled.output
    assert "Dakwerk" in recalled.output and "capped" not in recalled.output
    prepared = runner.invoke(app, ["prepare", "how much will the roof cost?", *who], env=cli_env)
    assert prepared.exit_code == 0 and "## Relevant evidence" in prepared.output
    assert "## Top documents" in prepared.output and "capped" not in prepared.output
    traced = runner.invoke(app, ["trace", "how much will the roof cost?", *who, "--mode", "timeline"],
                           env=cli_env)
    assert traced.exit_code == 0, traced.output
    for stage in ("1. candidate pools", "dense:", "lexical:", "graph:", "timeline:",
                  "3. reranker:", "5. budget:", "6. side effects:", "7. rendered", "timings:"):
        assert stage in traced.output, stage
    assert "capped" not in traced.output and "board.md" not in traced.output
    # The exec reader sees the memo; bad input is refused with a clear message.
    boss = runner.invoke(app, ["recall", "roof budget cap", "--org", t.org_id, "--as", "carol",
                               "--read", "team,exec"], env=cli_env)
    assert "capped" in boss.output
    bad = runner.invoke(app, ["recall", "   ", *who], env=cli_env)
    assert bad.exit_code == 1 and "the question is empty" in bad.output
    bad = runner.invoke(app, ["trace", "roof", *who, "--mode", "psychic"], env=cli_env)
    assert bad.exit_code == 1 and "unknown mode" in bad.output
