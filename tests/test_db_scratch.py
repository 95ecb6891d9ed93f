"""A scratch database (benchmarks' throwaway cluster) is stopped and deleted when its process
is killed with SIGTERM, as on a normal exit; before, each killed run left a server running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = """
import sys, time
from orchestrator.db.scratch import scratch_database
with scratch_database() as db:
    print(db.settings.home, db.server.pid(), flush=True)
    time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under the server's own user
        return True
    return True


@pytest.mark.timeout(180)
def test_a_killed_benchmark_stops_and_deletes_its_scratch_database() -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, f"the scratch database did not start: {line}"
    home, server_pid = Path(line[0]), int(line[1])
    assert home.exists() and _alive(server_pid)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    deadline = time.monotonic() + 30
    while _alive(server_pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(server_pid), "the scratch PostgreSQL outlived its killed benchmark"
    assert not home.parent.exists()
