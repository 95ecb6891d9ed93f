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


def test_every_policy_has_an_allow_and_a_deny_case(tap_db: tuple[Path, str]) -> None:
    """The coverage check (sql_checks/65_policy_coverage.sql) over this run's passing cases;
    files not run yet in this session (``-k``) run first."""
    psql_bin, url = tap_db
    for path in FILES:
        if path.name not in RESULTS:
            RESULTS[path.name] = pgtap.run_file(psql_bin, url, path)
    cases = [case for name, result in sorted(RESULTS.items()) for case in pgtap.policy_cases(name, result)]
    pgtap.load_policy_cases(psql_bin, url, cases)
    path = pgtap.coverage_file()
    result = pgtap.run_file(psql_bin, url, path)
    RESULTS[path.name] = result
    assert result.ok, (
        f"{path.name}: {len(cases)} tagged cases passed; planned {result.planned}, passed "
        f"{result.passed}, failed {len(result.failed)}\n{result.output[-6000:]}")
    print("".join(f"\n{line.lstrip('# ')}" for line in result.output.splitlines()
                  if line.startswith("# policy coverage")))


def test_suite_is_not_empty() -> None:
    assert len(FILES) >= 3, "sql_checks/ must hold the numbered pgTAP files"
