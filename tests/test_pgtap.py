"""The pgTAP suite (``sql_checks/``), run as part of pytest so one command runs both."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TestDatabase
from tests.support import pgtap

FILES = pgtap.check_files()
RESULTS: dict[str, pgtap.TapResult] = {}


@pytest.fixture(scope="module")
def tap_db(test_db: TestDatabase) -> tuple[Path, str]:
    psql_bin = test_db.database.server.client_bin("psql")
    pgtap.install(psql_bin, test_db.psql_url)
    return psql_bin, test_db.psql_url


@pytest.mark.parametrize("path", FILES, ids=[p.name for p in FILES])
def test_sql_check(tap_db: tuple[Path, str], path: Path) -> None:
    psql_bin, url = tap_db
    result = pgtap.run_file(psql_bin, url, path)
    RESULTS[path.name] = result
    assert result.ok, (
        f"{path.name}: planned {result.planned}, passed {result.passed}, "
        f"failed {len(result.failed)}, psql exit {result.returncode}\n{result.output[-6000:]}"
    )


def test_suite_is_not_empty() -> None:
    assert len(FILES) >= 3, "sql_checks/ must hold the numbered pgTAP files"
