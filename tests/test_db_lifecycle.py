"""`engram db ...` lifecycle against a real embedded cluster of its own."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.db.server import free_port

ENGRAM = [sys.executable, "-m", "orchestrator.cli.main"]


@pytest.fixture
def home() -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are private to root, and under root the
    # server runs as an unprivileged user that must reach its data directory.
    tmp = Path(tempfile.mkdtemp(prefix="engram-lifecycle-"))
    tmp.chmod(0o755)
    yield tmp / "home"
    subprocess.run([*ENGRAM, "db", "stop"], env=_env(tmp / "home", 0), capture_output=True,
                   check=False)
    shutil.rmtree(tmp, ignore_errors=True)


_PORTS: dict[Path, int] = {}


def _env(home: Path, port: int) -> dict[str, str]:
    if port:
        _PORTS[home] = port
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env.update(ENGRAM_HOME=str(home), ENGRAM_DB_PORT=str(_PORTS.get(home, port)))
    return env


def engram(home: Path, *args: str, port: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ENGRAM, *args], env=_env(home, port), capture_output=True, text=True,
                          timeout=180, check=False)


def test_start_status_stop_and_repeats(home: Path) -> None:
    port = free_port()
    first = engram(home, "db", "start", port=port)
    assert first.returncode == 0, first.stderr
    assert "started" in first.stdout

    status = engram(home, "db", "status")
    assert status.returncode == 0, status.stderr
    assert "running" in status.stdout

    again = engram(home, "db", "start")
    assert again.returncode == 0
    assert "already running" in again.stdout

    migrated = engram(home, "db", "migrate")
    assert migrated.returncode == 0, migrated.stderr
    assert "migrated to" in migrated.stdout

    psql = engram(home, "db", "psql", "--role", "engram_app", "-tAc", "select current_user")
    assert psql.returncode == 0, psql.stderr
    assert psql.stdout.strip() == "engram_app"

    url = engram(home, "db", "url")
    assert url.stdout.strip().startswith("postgresql://engram_app:")
    assert f":{port}/" in url.stdout

    stopped = engram(home, "db", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout

    twice = engram(home, "db", "stop")
    assert twice.returncode == 0
    assert "not running" in twice.stdout

    down = engram(home, "db", "status")
    assert down.returncode == 3
    assert "stopped" in down.stdout


def test_stale_pid_file_is_reported_and_cleared(home: Path) -> None:
    port = free_port()
    assert engram(home, "db", "start", port=port).returncode == 0
    assert engram(home, "db", "stop").returncode == 0
    # A pid file left behind by a server that died with the machine: its pid is gone.
    dead = subprocess.Popen(["true"])
    dead.wait()
    pid_file = home / "pgdata" / "postmaster.pid"
    pid_file.write_text(f"{dead.pid}\n{home / 'pgdata'}\n0\n{port}\n\n\n\nstopped\n")

    status = engram(home, "db", "status")
    assert status.returncode == 3
    assert "stale postmaster.pid" in status.stdout

    started = engram(home, "db", "start")
    assert started.returncode == 0, started.stderr
    assert "removed a stale postmaster.pid" in started.stdout


def test_port_in_use_is_a_clear_error(home: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        port = sock.getsockname()[1]
        result = engram(home, "db", "start", port=port)
    assert result.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    # Nothing runs, and the next start on a free port works.
    assert engram(home, "db", "status").returncode == 3


def test_external_url_refuses_lifecycle_commands(home: Path) -> None:
    env = _env(home, free_port())
    env["ENGRAM_DATABASE_URL"] = "postgresql://nobody@127.0.0.1:1/none"
    result = subprocess.run([*ENGRAM, "db", "start"], env=env, capture_output=True, text=True,
                            check=False, timeout=60)
    assert result.returncode == 1
    assert "external server" in result.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the unprivileged system user is used only under root")
def test_server_runs_as_unprivileged_user_under_root(home: Path) -> None:
    assert engram(home, "db", "start", port=free_port()).returncode == 0
    pid = int((home / "pgdata" / "postmaster.pid").read_text().splitlines()[0])
    uid = os.stat(f"/proc/{pid}").st_uid
    assert uid != 0, "the embedded server must not run as root"
    assert os.stat(home / "pgdata").st_uid == uid
