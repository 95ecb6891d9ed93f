"""Running the pgTAP suite in ``sql_checks/`` against the test database.

pgTAP is not on PyPI. ``make test`` downloads Debian's ``postgresql-15-pgtap``
package (pure SQL, loads into PostgreSQL 18) into ``.cache/pgtap``; its
``pgtap.sql`` is installed into the schema ``tap`` of the test database, and
``sql_checks/helpers.sql`` into the schema ``tests``. Each numbered file is run
by ``psql`` in its own session and its TAP output is parsed here.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SQL_CHECKS = REPO / "sql_checks"


def pgtap_sql() -> Path:
    candidates = [os.environ.get("ENGRAM_PGTAP_SQL", "")]
    candidates += sorted(glob.glob(str(REPO / ".cache/pgtap/usr/share/postgresql/*/extension/pgtap.sql")))
    candidates += sorted(glob.glob("/usr/share/postgresql/*/extension/pgtap.sql"))
    for cand in candidates:
        if cand and Path(cand).is_file():
            return Path(cand)
    raise FileNotFoundError(
        "pgTAP's SQL is missing: run `make pgtap` (downloads Debian's postgresql-15-pgtap into "
        ".cache/pgtap) or set ENGRAM_PGTAP_SQL to a pgtap.sql file"
    )


# The policy-coverage check runs last, over the tags of the cases every other file passed.
COVERAGE_FILE = "65_policy_coverage.sql"
POLICY_TAG = re.compile(r"\[policy ([a-z][a-z0-9_]*) (allow|deny)\]")


def check_files() -> list[Path]:
    """The numbered files, in order, without the coverage check (``coverage_file``)."""
    return sorted(p for p in SQL_CHECKS.glob("*.sql")
                  if re.match(r"^\d\d_", p.name) and p.name != COVERAGE_FILE)


def coverage_file() -> Path:
    return SQL_CHECKS / COVERAGE_FILE


def policy_cases(file: str, result: TapResult) -> list[tuple[str, str, str, str]]:
    """(policy, allow|deny, file, description) of every passing case that carries a tag."""
    cases = []
    for line in result.output.splitlines():
        if not line.startswith("ok "):
            continue
        description = line.split(" - ", 1)[1] if " - " in line else ""
        cases += [(policy, kind, file, description) for policy, kind in POLICY_TAG.findall(description)]
    return cases


def load_policy_cases(psql_bin: Path, url: str, cases: list[tuple[str, str, str, str]]) -> None:
    """Replace ``tests.policy_cases`` with ``cases`` (committed: the coverage file reads them)."""
    def lit(value: str) -> str:
        return "'" + value.replace("'", "''") + "'"

    rows = ",\n".join(f"({', '.join(lit(v) for v in case)})" for case in cases)
    script = ("create table if not exists tests.policy_cases (policy text not null, kind text not null, "
              "file text not null, description text not null);\n"
              "truncate tests.policy_cases;\n"
              + (f"insert into tests.policy_cases values\n{rows};\n" if cases else ""))
    path = REPO / ".cache" / "pgtap-policy-cases.sql"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    res = psql(psql_bin, url, file=path)
    if res.returncode != 0:
        raise RuntimeError(f"loading the policy cases failed:\n{res.stderr[-4000:]}")


@dataclass
class TapResult:
    planned: int | None
    passed: int
    failed: list[str]
    output: str
    returncode: int

    @property
    def ok(self) -> bool:
        ran = self.passed + len(self.failed)
        return (self.returncode == 0 and not self.failed and self.planned is not None
                and ran == self.planned)


def psql(psql_bin: Path, url: str, *, file: Path | None = None, sql: str | None = None,
         search_path: str = "tap, public") -> subprocess.CompletedProcess[str]:
    args = [str(psql_bin), url, "-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"]
    if file is not None:
        args += ["-f", str(file)]
    if sql is not None:
        args += ["-c", sql]
    env = dict(os.environ, PGOPTIONS=f"-c search_path={search_path.replace(' ', '')}")
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, check=False)


def install(psql_bin: Path, url: str) -> None:
    """Install pgTAP (schema ``tap``) and the shared helpers (schema ``tests``)."""
    done = psql(psql_bin, url, sql="select count(*) from pg_namespace where nspname = 'tap'")
    if done.returncode == 0 and done.stdout.strip() == "1":
        return
    src = pgtap_sql().read_text()
    setup = "create schema tap; grant usage on schema tap to public; set search_path = tap;\n"
    script = REPO / ".cache" / "pgtap-install.sql"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(setup + src)
    res = psql(psql_bin, url, file=script, search_path="tap")
    if res.returncode != 0:
        raise RuntimeError(f"installing pgTAP failed:\n{res.stderr[-4000:]}")
    res = psql(psql_bin, url, file=SQL_CHECKS / "helpers.sql")
    if res.returncode != 0:
        raise RuntimeError(f"installing sql_checks/helpers.sql failed:\n{res.stderr[-4000:]}")


def run_file(psql_bin: Path, url: str, path: Path) -> TapResult:
    res = psql(psql_bin, url, file=path)
    planned = None
    passed = 0
    failed: list[str] = []
    for line in res.stdout.splitlines():
        if m := re.match(r"^1\.\.(\d+)$", line.strip()):
            planned = int(m.group(1))
        elif line.startswith("ok "):
            passed += 1
        elif line.startswith("not ok "):
            failed.append(line)
    output = res.stdout + ("\n" + res.stderr if res.stderr else "")
    return TapResult(planned, passed, failed, output, res.returncode)
