"""Fixtures of the adversarial suite: the seed (printed; ``ENGRAM_ADVERSARIAL_SEED`` replays a
run), the API server, and the figures each class reports at the end of the run."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator

import pytest

from tests.adversarial import figures
from tests.support.api import api_home, api_server  # noqa: F401
from tests.support.recall import embedder  # noqa: F401


@pytest.fixture(scope="session")
def seed() -> int:
    value = int(os.environ.get("ENGRAM_ADVERSARIAL_SEED") or random.SystemRandom().randrange(2**32))
    figures.SEED[:] = [value]
    print(f"\nadversarial seed {value}")
    return value


@pytest.fixture(autouse=True)
def timed(request: pytest.FixtureRequest) -> Iterator[None]:
    """Wall and CPU seconds of each class (this process: the test, the API server's threads and
    the models; the database server's own CPU is not in it)."""
    wall, cpu = time.perf_counter(), time.process_time()
    yield
    name = request.node.module.__name__.rsplit(".", 1)[-1].removeprefix("test_")
    figures.record("seconds", **{f"{name}_wall": round(time.perf_counter() - wall),
                                 f"{name}_cpu": round(time.process_time() - cpu)})


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not figures.FIGURES:
        return
    terminalreporter.write_sep("=", "adversarial figures")
    for line in figures.lines():
        terminalreporter.write_line(line)
