"""Run one derive job in this process and SIGKILL it mid-run: the crash tests' real crash.

``python -m tests.support.killed_run JOB TABLE N`` runs ``JOB`` (communities,
profiles or lifecycle) as the identity in ``KILLED_RUN_IDENTITY`` (JSON: org,
user, read, write) on ``KILLED_RUN_URL`` (an ``engram_app`` URL, passed in the
environment so no password shows in a process list), and kills itself with
SIGKILL right after the ``N``-th INSERT or UPDATE statement on ``TABLE`` has run
inside the job's transaction. Nothing in the process gets to clean up: the
server sees the connection drop and rolls the transaction back, which is what
a worker killed by the kernel looks like. ``kill_midway`` is the test side.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def kill_midway(app_url: str, identity: dict[str, Any], job: str, table: str, after: int = 1,
                timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``job`` in a child process that SIGKILLs itself after ``after`` writes to ``table``."""
    env = {**os.environ, "KILLED_RUN_URL": app_url, "KILLED_RUN_IDENTITY": json.dumps(identity),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tests.support.killed_run", job, table, str(after)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def main() -> None:
    from sqlalchemy import event

    from orchestrator.auth import Identity
    from orchestrator.db.engine import make_app_engine
    from orchestrator.db.session import bound_session

    job, table, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    who = json.loads(os.environ["KILLED_RUN_IDENTITY"])
    identity = Identity.of(who["org"], who["user"], read=tuple(who.get("read", ())),
                           write=tuple(who.get("write", ())))
    engine = make_app_engine(os.environ["KILLED_RUN_URL"], pool_size=1)
    seen = [0]

    def after_execute(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        head = " ".join(statement.split()[:3]).lower()
        if table in head and head.startswith(("insert", "update")):
            seen[0] += 1
            if seen[0] >= after:
                os.kill(os.getpid(), signal.SIGKILL)

    event.listen(engine, "after_cursor_execute", after_execute)
    with bound_session(engine, identity) as session:
        if job == "communities":
            from orchestrator.derive.communities import rebuild

            rebuild(session)
        elif job == "profiles":
            from orchestrator.derive.profiles import refresh

            refresh(session)
        elif job == "lifecycle":
            from orchestrator.derive.lifecycle import sweep

            sweep(session, apply=True, as_of=datetime.now(UTC) + timedelta(days=int(who["days"])))
        else:
            raise SystemExit(f"unknown job {job!r}")
    # Reaching this line means the job never wrote to the table: the test says so.
    print("finished without being killed")


if __name__ == "__main__":
    main()
