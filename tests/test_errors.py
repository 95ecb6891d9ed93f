"""The one SQLSTATE mapping covers every error code the migrations raise."""

from __future__ import annotations

import re

import pytest

from orchestrator.errors import (
    BadInput,
    Conflict,
    EngramError,
    Forbidden,
    NotFound,
    Unauthenticated,
    database_refusal,
    error_class_for,
    from_sqlstate,
    is_public,
)
from tests.conftest import REPO


def raised_codes() -> set[str]:
    """Every SQLSTATE a migration raises (``raise exception ... using errcode = '...'``;
    a raise without one is P0001)."""
    codes = set()
    for path in sorted((REPO / "db" / "versions").glob("*.py")):
        source = path.read_text()
        for match in re.finditer(r"raise\s+exception\b(.*?);\s*$", source, re.S | re.I | re.M):
            found = re.search(r"errcode\s*=\s*'([0-9A-Z]{5})'", match.group(1))
            codes.add(found.group(1) if found else "P0001")
    return codes


def test_the_migrations_raise_the_codes_this_test_knows() -> None:
    # A guard for the scan itself: if it found nothing, the next test would prove nothing.
    assert {"22023", "23503", "28000", "42501", "42P16", "55000", "P0002"} <= raised_codes()


@pytest.mark.parametrize("sqlstate", sorted(raised_codes()))
def test_every_raised_sqlstate_has_a_code(sqlstate: str) -> None:
    assert error_class_for(sqlstate) is not EngramError, f"{sqlstate} would reach clients as INTERNAL"


@pytest.mark.parametrize(("sqlstate", "cls"), [
    ("55000", Conflict), ("23505", Conflict), ("40001", Conflict), ("40P01", Conflict),
    ("42P16", BadInput), ("P0001", BadInput), ("22P02", BadInput), ("54000", BadInput),
    ("42501", Forbidden), ("P0002", NotFound), ("28000", Unauthenticated),
])
def test_mapping(sqlstate: str, cls: type[EngramError]) -> None:
    error = from_sqlstate(sqlstate, "m")
    assert type(error) is cls and error.sqlstate == sqlstate and is_public(error)


def test_an_unmapped_database_error_keeps_its_text_private() -> None:
    assert not is_public(from_sqlstate("XX000", "internal detail with data"))
    assert is_public(EngramError("recall is not configured on this server"))


@pytest.mark.parametrize(("sqlstate", "message", "constraint", "table", "column", "shown"), [
    ("23505", 'duplicate key value violates unique constraint "uq_documents_tenant_id_collection_path"',
     "uq_documents_tenant_id_collection_path", "documents", None, "duplicate key"),
    ("23514", 'new row for relation "entities" violates check constraint '
              '"ck_entities_canonical_name_length"', "ck_entities_canonical_name_length", "entities",
     None, "the rule 'canonical name length' of entities"),
    ("23502", 'null value in column "title" of relation "documents" violates not-null constraint',
     None, "documents", "title", "missing: title"),
    ("42501", 'new row violates row-level security policy for table "documents"', None, "documents",
     None, "write access to every scope"),
    ("55P03", 'could not obtain lock on row in relation "documents"', None, None, None, "retry"),
])
def test_database_refusals_name_no_constraint_table_or_policy(
        sqlstate: str, message: str, constraint: str | None, table: str | None, column: str | None,
        shown: str) -> None:
    error = database_refusal(sqlstate, message, own=False, constraint=constraint, table=table,
                             column=column)
    assert is_public(error) and error.code != "INTERNAL" and shown in error.message
    for internal in ("uq_", "ck_", "violates", "relation", "policy", '"'):
        assert internal not in error.message


def test_engram_s_own_wording_and_bad_values_are_kept() -> None:
    own = database_refusal("42501", "no write access to entity 1", own=True)
    assert own.message == "no write access to entity 1" and type(own) is Forbidden
    value = database_refusal("22P02", 'invalid input syntax for type uuid: "x"', own=False)
    assert value.message == 'invalid input syntax for type uuid: "x"' and type(value) is BadInput
    hidden = database_refusal("XX000", "cache lookup failed for relation 1", own=False)
    assert not is_public(hidden)
