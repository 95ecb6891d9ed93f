"""``engram models`` and ``engram worker`` argument handling (no database needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from orchestrator.cli.main import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_HOME", str(tmp_path / "home"))
    # A port nothing listens on: the registry part of `list` must report, not hang or crash.
    monkeypatch.setenv("ENGRAM_DB_PORT", "9")
    monkeypatch.setenv("COLUMNS", "250")  # rich would wrap long model names at 80


def test_models_list_shows_configured_and_present() -> None:
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    assert "sentence-transformers/all-MiniLM-L6-v2" in result.output
    assert "BAAI/bge-reranker-v2-m3" in result.output
    assert "registry is not reachable" in result.output


def test_models_check_loads_and_reports_the_missing_reranker(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from orchestrator.worker.embedder import Reranker

    monkeypatch.setattr(Reranker, "_cache", {})  # the load (and its warning) happens here
    result = runner.invoke(app, ["models", "check"])
    assert result.exit_code == 0, result.output
    assert "embedding: sentence-transformers/all-MiniLM-L6-v2 loads (384-d" in result.output
    flat = " ".join(result.output.split())
    assert "one question at a time: traced" in flat
    assert "trained on locomo-dev (" in flat and "locomo+derive questions)" in flat
    # Said once, as check's own line: the load's log warning (printed by logging's
    # last-resort handler in a terminal) said it a second time.
    assert result.output.count("not on this machine") == 1, result.output
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("engram")]
    strict = runner.invoke(app, ["models", "check", "--strict"])
    assert strict.exit_code == 1


def test_bad_arguments_get_clear_errors() -> None:
    result = runner.invoke(app, ["models", "fetch", "--role", "tokenizer"])
    assert result.exit_code == 2 and "--role must be embedding, reranker or all" in result.output
    result = runner.invoke(app, ["worker", "run", "--once", "--tenant", "not-a-uuid"])
    assert result.exit_code == 1 and "--tenant takes a tenant id" in result.output


def test_logs_go_to_the_stderr_of_the_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``engram`` log handler writes to ``sys.stderr`` as it is when a record is logged:
    a stderr that was replaced and closed since logging was set up (a test's CliRunner, an
    application that ran a command in-process) no longer turns each log line into a
    "--- Logging error ---" traceback on the next stream."""
    import io
    import logging

    from orchestrator.cli.logs import configure_logging
    from orchestrator.config import Settings

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    configure_logging(Settings())
    first.close()
    monkeypatch.setattr("sys.stderr", second)
    logging.getLogger("engram.test").info("after the %s stream closed", "first")
    assert "after the first stream closed" in second.getvalue()
    assert "Logging error" not in second.getvalue()
