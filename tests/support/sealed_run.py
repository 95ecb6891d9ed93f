"""Recall in a child process that is SIGKILLed after its receipt is sealed, before it is chained.

``python -m tests.support.sealed_run QUESTION`` recalls ``QUESTION`` as the identity in
``SEALED_RUN_IDENTITY`` (JSON: org, user, read) on ``SEALED_RUN_URL`` (an ``engram_app``
URL, in the environment so no password shows in a process list) through a real
``Recaller`` whose receipt chainer would wait an hour: the recall's transaction commits
the sealed receipt and its queued chain event, the process prints the receipt id and kills
itself with SIGKILL. No exit handler runs, so nothing chains it: the test side
(``kill_after_seal``) is left with exactly what a crashed API process leaves.

The query embedding is a fixed unit vector (the dense lane still runs; what is measured
here is the receipt, not ranking), so the child loads no model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def kill_after_seal(app_url: str, identity: dict[str, Any], question: str,
                    timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SEALED_RUN_URL": app_url, "SEALED_RUN_IDENTITY": json.dumps(identity),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tests.support.sealed_run", question],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


class _FixedEmbedder:
    """A unit vector for every question, as the active model (no model_name: the recaller
    checks a named fixed embedder against the registry's active model)."""

    def embed_query(self, question: str, asker: str | None = None) -> Any:
        import numpy as np

        from orchestrator.db.models import EMBEDDING_DIMENSION

        v = np.zeros(EMBEDDING_DIMENSION, dtype=np.float32)
        v[0] = 1.0
        return v


class _NoReranker:
    available = False
    note = "none in this child"

    def score(self, query: str, passages: Any) -> list[float]:
        raise AssertionError("not called")


def main() -> None:
    from orchestrator.auth import Identity
    from orchestrator.config import Settings
    from orchestrator.db.engine import make_app_engine
    from orchestrator.recall import Recaller

    who = json.loads(os.environ["SEALED_RUN_IDENTITY"])
    identity = Identity.of(who["org"], who["user"], read=tuple(who.get("read", ())))
    engine = make_app_engine(os.environ["SEALED_RUN_URL"], pool_size=1)
    settings = Settings(recall_chain_delay_s=3600.0, recall_chain_interval_s=3600.0)
    recaller = Recaller(engine, settings, embedder=_FixedEmbedder(), reranker=_NoReranker())
    _, trace = recaller.trace(identity, sys.argv[1])
    print(json.dumps({"receipt": str(trace.receipt_id)}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    main()
