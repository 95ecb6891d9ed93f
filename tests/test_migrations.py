"""Migrations on a real server: upgrade, downgrade, upgrade; and no model/schema drift."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, pool, text
from sqlalchemy.engine import make_url

from orchestrator.db import migrate
from orchestrator.db.schema import schema_drift
from tests.conftest import TestDatabase


@pytest.fixture
def scratch_url(test_db: TestDatabase) -> Iterator[str]:
    """A fresh, empty database on the test server, dropped afterwards."""
    name = f"engram_mig_{uuid.uuid4().hex[:8]}"
    admin = create_engine(test_db.admin_url, isolation_level="AUTOCOMMIT", poolclass=pool.NullPool)
    with admin.connect() as conn:
        conn.exec_driver_sql(f'create database "{name}"')
    url = make_url(test_db.admin_url).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'drop database "{name}" with (force)')
        admin.dispose()


def _objects(url: str) -> dict[str, int]:
    eng = create_engine(url, poolclass=pool.NullPool)
    with eng.connect() as conn:
        rows = conn.execute(text(
            "select n.nspname, count(c.oid) from pg_namespace n "
            "left join pg_class c on c.relnamespace = n.oid "
            "where pg_get_userbyid(n.nspowner) = 'engram_owner' group by n.nspname"
        )).all()
    eng.dispose()
    return {r[0]: int(r[1]) for r in rows}


def test_upgrade_downgrade_upgrade(scratch_url: str) -> None:
    migrate.upgrade(scratch_url, "head")
    first = _objects(scratch_url)
    assert {"auth", "sources", "engram"} <= set(first)
    assert migrate.current_revision(scratch_url) == migrate.head_revision()

    migrate.downgrade(scratch_url, "base")
    assert _objects(scratch_url) == {}, "downgrade to base must remove every Engram schema"
    assert migrate.current_revision(scratch_url) is None

    migrate.upgrade(scratch_url, "head")
    assert _objects(scratch_url) == first, "a second upgrade must rebuild the same objects"


def test_index_tier_recorded(admin_engine) -> None:  # type: ignore[no-untyped-def]
    with admin_engine.connect() as conn:
        tier = conn.execute(text(
            "select value from engram.installation where key = 'index_tier'")).scalar_one()
        has_vchord = conn.execute(text(
            "select count(*) from pg_available_extensions where name = 'vchord'")).scalar_one()
        indexes = set(conn.execute(text(
            "select indexname from pg_indexes where schemaname = 'sources'")).scalars())
    assert tier == ("vectorchord" if has_vchord else "pgvector")
    if tier == "pgvector":
        assert {"ix_chunks_embedding_hnsw", "ix_chunks_tenant_id_lexical"} <= indexes
    else:
        assert {"ix_chunks_embedding_vchordrq", "ix_chunks_bm25"} <= indexes


def test_mapped_tables_match_migrated_schema(test_db: TestDatabase) -> None:
    eng = create_engine(test_db.admin_url, poolclass=pool.NullPool)
    with eng.connect() as conn:
        diff = schema_drift(conn)
    eng.dispose()
    assert diff == [], f"mapped tables differ from the migrated schema: {diff}"


def test_released_revisions_are_frozen() -> None:
    """A released revision never changes: db/released.sha256 pins each one's bytes."""
    import hashlib
    from pathlib import Path

    versions = Path(migrate.__file__).resolve().parents[2] / "db"
    lines = (versions / "released.sha256").read_text().split("\n")
    pinned = dict(reversed(line.split()) for line in lines if line.strip())
    assert len(pinned) >= 3
    for name, digest in pinned.items():
        actual = hashlib.sha256((versions / "versions" / name).read_bytes()).hexdigest()
        assert actual == digest, f"released revision {name} was edited; add a new revision instead"


def test_columns_added_to_chained_tables_are_rebaselined(scratch_url: str) -> None:
    """0010 adds columns to chained tables; rows written before it still verify afterwards."""
    migrate.upgrade(scratch_url, "0009_derive")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    with eng.begin() as conn:
        tenant = conn.execute(text("select auth.create_tenant('org-mig', 'Migrated')")).scalar_one()
        scope = conn.execute(text("select auth.create_scope(:t, 'team', 'Team')"), {"t": tenant}).scalar_one()
        conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, content_hash, scopes) "
            "values (:t, 'notes', 'a.md', 'A', 'Alpha body', sha256('Alpha body'), array[cast(:s as uuid)])"),
            {"t": tenant, "s": scope})
        conn.execute(text(
            "insert into memory.decisions (tenant_id, category, scenario, reasoning, confidence, scopes) "
            "values (:t, 'db', 'Which database?', 'PostgreSQL owns the data.', 0.9, "
            "array[cast(:s as uuid)])"),
            {"t": tenant, "s": scope})
    migrate.upgrade(scratch_url, "head")
    with eng.connect() as conn:
        problems = conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all()
        kinds = conn.execute(text(
            "select table_name, operation from provenance.events where tenant_id = :t "
            "and table_name in ('sources.documents', 'memory.decisions') order by seq"),
            {"t": tenant}).all()
        embed_text = conn.execute(text("select embed_text from memory.decisions")).scalar_one()
    eng.dispose()
    assert problems == [], f"rows written before 0010 no longer match their chain: {problems}"
    assert ("sources.documents", "BASELINE") in kinds and ("memory.decisions", "BASELINE") in kinds
    assert embed_text == "db: Which database? Reasoning: PostgreSQL owns the data."


def _document_with_chunks(eng: Engine, org: str, path: str, bodies: tuple[str, ...]) -> Any:
    """A tenant with one scope and one document of ``bodies`` as its chunks, written as the
    superuser at whatever revision the database is; returns the tenant's id."""
    with eng.begin() as conn:
        tenant = conn.execute(text("select auth.create_tenant(:o, 'Org')"), {"o": org}).scalar_one()
        scope = conn.execute(text("select auth.create_scope(:t, 'team', 'Team')"), {"t": tenant}).scalar_one()
        body = "\n\n".join(bodies)
        doc = conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, content_hash, scopes) "
            "values (:t, 'notes', :p, :p, :b, sha256(convert_to(:b, 'UTF8')), "
            "array[cast(:s as uuid)]) returning id"),
            {"t": tenant, "s": scope, "p": path, "b": body}).scalar_one()
        for n, chunk in enumerate(bodies):
            conn.execute(text(
                "insert into sources.chunks (tenant_id, document_id, ordinal, text, char_start, char_end) "
                "values (:t, :d, :n, :b, 0, length(:b))"), {"t": tenant, "d": doc, "n": n, "b": chunk})
    return tenant


def test_rows_written_before_the_cost_revisions_keep_working(scratch_url: str) -> None:
    """0041 counts the terms of chunks written before it (as the superuser: the owner sees no
    chunk under forced RLS); 0040's queue takes receipts written after it, and the ones chained
    before still verify."""
    migrate.upgrade(scratch_url, "0019_derivation_batches")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    tenant = _document_with_chunks(eng, "org-cost", "a.md", ("The river bridge.", "A river, a harbour."))
    migrate.upgrade(scratch_url, "head")
    with eng.connect() as conn:
        df = dict(conn.execute(text(
            "select lexeme, sum(chunks) from recall.lexical_terms where tenant_id = :t group by 1"),
            {"t": tenant}).all())
        deltas = conn.execute(text("select count(*) from recall.lexical_term_deltas")).scalar_one()
        problems = conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all()
    eng.dispose()
    assert df == {"river": 2, "bridg": 1, "harbour": 1} and deltas == 0  # counted, folded already
    assert problems == []


def test_recall_probes_stay_index_probes_under_rls(admin_engine) -> None:  # type: ignore[no-untyped-def]
    """0014: the lexical match is leakproof (where the migrating role could make it so), the
    title key is a stored column, and the app role plans every statement for its parameters."""
    with admin_engine.connect() as conn:
        superuser = conn.execute(text("select rolsuper from pg_roles where rolname = current_user")).scalar()
        leakproof = conn.execute(text(
            "select proleakproof from pg_proc where oid = 'ts_match_vq'::regproc")).scalar()
        generated = conn.execute(text(
            "select attgenerated from pg_attribute where attrelid = 'sources.documents'::regclass "
            "and attname = 'title_key'")).scalar()
        settings = set(conn.execute(text(
            "select unnest(s.setconfig) from pg_db_role_setting s join pg_roles r on r.oid = s.setrole "
            "where r.rolname = 'engram_app' and s.setdatabase = (select oid from pg_database "
            "where datname = current_database())")).scalars())
    assert generated == "s"
    assert {"plan_cache_mode=force_custom_plan", "hnsw.ef_search=200"} <= settings
    if superuser:
        assert leakproof is True


def test_a_statement_whose_client_has_gone_is_stopped(app_engine: Engine,
                                                     scratch_url: str) -> None:
    """0092: the login roles check their client's socket every 10 s while a statement runs
    (a derive job's backend ran on for minutes after its process was stopped); downgraded,
    the setting goes."""
    with app_engine.connect() as conn:
        assert conn.execute(text("show client_connection_check_interval")).scalar() == "10s"

    def settings(url: str) -> dict[str, set[str]]:
        eng = create_engine(url, poolclass=pool.NullPool)
        with eng.connect() as conn:
            rows = conn.execute(text(
                "select r.rolname, unnest(s.setconfig) from pg_db_role_setting s join pg_roles r "
                "on r.oid = s.setrole where s.setdatabase = (select oid from pg_database where "
                "datname = current_database())")).all()
        eng.dispose()
        found: dict[str, set[str]] = {}
        for role, setting in rows:
            found.setdefault(role, set()).add(setting)
        return found

    migrate.upgrade(scratch_url, "head")
    check = "client_connection_check_interval=10s"
    assert all(check in settings(scratch_url).get(r, set())
               for r in ("engram_app", "engram_worker", "engram_auditor"))
    migrate.downgrade(scratch_url, "0091_conflict_sweep_shaped")
    assert not any(check in v for v in settings(scratch_url).values())
    assert "plan_cache_mode=force_custom_plan" in settings(scratch_url)["engram_app"]  # kept


def test_chunks_written_before_0086_get_their_task_words(scratch_url: str) -> None:
    """0086 recomputes the lexical vector of every chunk holding a task list (as the migrating
    superuser: every tenant's), and only those; their text, hash and provenance stay valid,
    and the reader's document frequencies count the new words. Downgraded, they go again."""
    migrate.upgrade(scratch_url, "0085_receipt_seal_names")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    tenant = _document_with_chunks(eng, "org-tasks", "inbox.md", (
        "# Inbox\n- [ ] Renew the contract\n- [x] Book the venue", "The river bridge."))

    def lexemes() -> dict[int, set[str]]:
        with eng.connect() as conn:
            return {n: set(v) for n, v in conn.execute(text(
                "select ordinal, tsvector_to_array(lexical) from sources.chunks "
                "where tenant_id = :t"), {"t": tenant}).all()}

    before = lexemes()
    assert "task" not in before[0]
    migrate.upgrade(scratch_url, "head")
    after = lexemes()
    assert after[0] == before[0] | {"open", "task", "todo", "to-do", "pend", "done", "complet",
                                    "finish"}
    assert after[1] == before[1]
    with eng.connect() as conn:
        df = dict(conn.execute(text(
            "select l, sum(n) from (select lexeme as l, chunks as n from recall.lexical_terms "
            "where tenant_id = :t union all select l, d.sign from recall.lexical_term_deltas d "
            "cross join unnest(d.lexemes) as l where d.tenant_id = :t) x group by l"),
            {"t": tenant}).all())
        problems = conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all()
    assert df["task"] == 1 and df["river"] == 1
    assert problems == []
    migrate.downgrade(scratch_url, "0085_receipt_seal_names")
    assert lexemes() == before
    eng.dispose()


def test_aliases_taken_before_0087_are_recorded_as_their_notes(scratch_url: str) -> None:
    """0087 records, per note with front matter aliases, the aliases the entity its title names
    (by name, exactly the note's scopes, a person first) has of them; one given by hand alone
    stays the entity's own; a string ``alias:`` counts. Every entity's chain still verifies
    (its row image gained the column). Downgraded, the column goes, and they verify."""
    migrate.upgrade(scratch_url, "0086_task_words")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    tenant = _document_with_chunks(eng, "org-aliases", "people/priya.md", ("- Based in Bangalore",))
    with eng.begin() as conn:
        scope = conn.execute(text("select id from auth.scopes where tenant_id = :t"),
                             {"t": tenant}).scalar_one()
        conn.execute(text(
            "update sources.documents set title = 'Priya Raman', "
            "metadata = '{\"aliases\": [\"PR\", \" Pri \", \"Zed\", true]}' where tenant_id = :t"),
            {"t": tenant})
        acme = conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, content_hash, "
            "scopes, metadata) values (:t, 'notes', 'acme.md', 'Acme', 'x', sha256('x'), "
            "array[cast(:s as uuid)], '{\"alias\": \"AC\"}') returning id"),
            {"t": tenant, "s": scope}).scalar_one()
        ids = {}
        for kind, name, aliases in (("person", "Priya Raman", ["PR", "Pri", "Hand"]),
                                    ("organization", "Priya Raman", ["PR"]),
                                    ("organization", "Acme", ["AC", "Acme Corp"])):
            ids[kind, name] = conn.execute(text(
                "insert into knowledge.entities (tenant_id, entity_type, canonical_name, aliases, "
                "scopes) values (:t, :k, :n, cast(:a as text[]), array[cast(:s as uuid)]) "
                "returning id"), {"t": tenant, "k": kind, "n": name, "a": aliases, "s": scope}
            ).scalar_one()
        docs = dict(conn.execute(text("select path, id from sources.documents where tenant_id = :t"),
                                 {"t": tenant}).all())
    assert acme == docs["acme.md"]
    with eng.begin() as conn:  # a note that opted out of extraction gives nothing
        conn.execute(text(
            "insert into sources.documents (tenant_id, collection, path, title, body, content_hash, "
            "scopes, metadata) values (:t, 'notes', 'acme-old.md', 'Acme', 'y', sha256('y'), "
            "array[cast(:s as uuid)], '{\"alias\": \"Acme Corp\", \"extract\": false}')"),
            {"t": tenant, "s": scope})
        updated = dict(conn.execute(text("select id, updated_at from knowledge.entities "
                                         "where tenant_id = :t"), {"t": tenant}).all())
    migrate.upgrade(scratch_url, "head")
    with eng.connect() as conn:
        given = {k: conn.execute(text("select given_aliases from knowledge.entities where id = :i"),
                                 {"i": i}).scalar_one() for k, i in ids.items()}
        after = dict(conn.execute(text("select id, updated_at from knowledge.entities "
                                       "where tenant_id = :t"), {"t": tenant}).all())
        problems = conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all()
    # An entity no note gave aliases to is not touched (its chain gets a BASELINE event).
    org = ids["organization", "Priya Raman"]
    assert after[org] == updated[org]
    note = str(docs["people/priya.md"])
    assert {k: {d: sorted(v) for d, v in g.items()} for k, g in given.items()} == {
        ("person", "Priya Raman"): {note: ["PR", "Pri"]},  # not "Hand", not "Zed" (she lacks it)
        ("organization", "Priya Raman"): {},  # a person first
        ("organization", "Acme"): {str(docs["acme.md"]): ["AC"]}}
    assert problems == []
    migrate.downgrade(scratch_url, "0086_task_words")
    with eng.connect() as conn:
        assert conn.execute(text(
            "select count(*) from information_schema.columns where table_schema = 'knowledge' "
            "and table_name = 'entities' and column_name = 'given_aliases'")).scalar_one() == 0
        # Each entity's row image changed with the column, and its chain says so both ways.
        assert conn.execute(text("select * from provenance.verify_rows(:t)"),
                            {"t": tenant}).all() == []
    eng.dispose()


def test_the_identity_functions_return_the_same_in_either_language(scratch_url: str) -> None:
    """0088 turns the five identity functions into PL/pgSQL and its downgrade back into SQL;
    each returns the same for no identity, a bound user and the derive service."""
    migrate.upgrade(scratch_url, "head")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    probe = text("select auth.tenant_id()::text, auth.user_id(), auth.read_scopes()::text, "
                 "auth.write_scopes()::text, auth.is_service()")
    languages = text("select array_agg(distinct l.lanname) from pg_proc p "
                     "join pg_language l on l.oid = p.prolang where p.pronamespace = "
                     "'auth'::regnamespace and p.proname in ('tenant_id', 'user_id', "
                     "'write_scopes', 'read_scopes', 'is_service')")

    def read() -> tuple[str, list[tuple[Any, ...]]]:
        with eng.begin() as conn:
            language = conn.execute(languages).scalar_one()
            rows = [tuple(conn.execute(probe).one())]
            conn.execute(text("select auth.bind_identity('org-idf', 'alice', array['team'], "
                              "array['exec'])"))
            rows.append(tuple(conn.execute(probe).one()))
            conn.execute(text("select auth.bind_service_identity('org-idf', array['team'])"))
            rows.append(tuple(conn.execute(probe).one()))
        return ",".join(language), rows

    with eng.begin() as conn:
        tenant = conn.execute(text("select auth.create_tenant('org-idf', 'Identity')")).scalar_one()
        for scope in ("team", "exec"):
            conn.execute(text("select auth.create_scope(:t, :s, :s)"), {"t": tenant, "s": scope})
    language, now = read()
    assert language == "plpgsql"
    assert now[0] == (None, None, "{}", "{}", False)
    assert now[1][:2] == (str(tenant), "alice") and now[1][4] is False
    assert len(now[1][2].split(",")) == 2 and now[1][3].strip("{}") in now[1][2]  # write implies read
    assert now[2][1] == "service:derive" and now[2][4] is True
    migrate.downgrade(scratch_url, "0087_document_aliases")
    assert read() == ("sql", now)
    migrate.upgrade(scratch_url, "head")
    assert read() == ("plpgsql", now)
    eng.dispose()


def test_0090_folds_to_zero_and_deletes_the_rows_0041_left_at_zero(scratch_url: str) -> None:
    """0041's fold left a lexeme whose every chunk went at ``chunks = 0`` (its delete could not
    see what its upsert wrote); 0090 deletes those rows, and its fold deletes a count that
    reaches 0. Its downgrade restores 0041's fold."""
    migrate.upgrade(scratch_url, "0089_chunk_sections")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    tenant = uuid.uuid4()
    scope = [uuid.uuid4()]

    def fold(*deltas: tuple[int, list[str]]) -> dict[str, int]:
        with eng.begin() as conn:
            for sign, lexemes in deltas:
                conn.execute(text("insert into recall.lexical_term_deltas (tenant_id, scopes, sign, "
                                  "lexemes) values (:t, :s, :n, :l)"),
                             {"t": tenant, "s": scope, "n": sign, "l": lexemes})
            conn.execute(text("select recall.fold_lexical_terms(1, :t)"), {"t": tenant})
            return dict(conn.execute(text("select lexeme, chunks from recall.lexical_terms "
                                          "where tenant_id = :t"), {"t": tenant}).all())

    with eng.begin() as conn:
        conn.execute(text("insert into auth.tenants (id, org_id, name) values (:t, 'org-fold', "
                          "'Fold')"), {"t": tenant})
    assert fold((1, ["river", "river", "bridg"])) == {"river": 2, "bridg": 1}
    assert fold((-1, ["bridg", "river"])) == {"river": 1, "bridg": 0}  # 0041: left at 0
    migrate.upgrade(scratch_url, "head")
    with eng.begin() as conn:
        assert dict(conn.execute(text("select lexeme, chunks from recall.lexical_terms")).all()) \
            == {"river": 1}
    assert fold((-1, ["river"]), (1, ["delta"]), (1, ["delta"])) == {"delta": 2}
    assert fold((-1, ["delta"]), (1, ["river"])) == {"delta": 1, "river": 1}
    migrate.downgrade(scratch_url, "0089_chunk_sections")
    assert fold((-1, ["delta"])) == {"delta": 0, "river": 1}  # 0041's fold again
    migrate.upgrade(scratch_url, "head")
    eng.dispose()


def test_chunks_written_before_0089_get_their_section_trails(scratch_url: str) -> None:
    """0089 gives every chunk of a document with headings the trail ingest would write (as the
    migrating superuser: every tenant's), leaves the rest null, and keeps the chains valid
    both ways (the rows' images change with the column)."""
    migrate.upgrade(scratch_url, "0088_identity_functions_plpgsql")
    eng = create_engine(scratch_url, poolclass=pool.NullPool)
    body = "# Guide\n\nIntro.\n\n## Setup\n\nStep one.\n\n### Linux\n\nRun it."
    pieces = ("# Guide\n\nIntro.", "## Setup\n\nStep one.", "Step one.", "Run it.")
    with eng.begin() as conn:
        tenant = conn.execute(text("select auth.create_tenant('org-sections', 'Org')")).scalar_one()
        scope = conn.execute(text("select auth.create_scope(:t, 'team', 'Team')"), {"t": tenant}).scalar_one()
        for path, text_ in (("guide.md", body), ("plain.md", "No headings here.")):
            doc = conn.execute(text(
                "insert into sources.documents (tenant_id, collection, path, title, body, "
                "content_hash, scopes) values (:t, 'notes', :p, 'Guide', :b, "
                "sha256(convert_to(:b, 'UTF8')), array[cast(:s as uuid)]) returning id"),
                {"t": tenant, "s": scope, "p": path, "b": text_}).scalar_one()
            chunks = pieces if path == "guide.md" else (text_,)
            for n, chunk in enumerate(chunks):
                start = text_.index(chunk)
                conn.execute(text(
                    "insert into sources.chunks (tenant_id, document_id, ordinal, text, "
                    "char_start, char_end) values (:t, :d, :n, :c, :s, :e)"),
                    {"t": tenant, "d": doc, "n": n, "c": chunk, "s": start, "e": start + len(chunk)})
    migrate.upgrade(scratch_url, "head")
    with eng.connect() as conn:
        sections = dict(conn.execute(text(
            "select c.text, c.section from sources.chunks c where c.tenant_id = :t"), {"t": tenant}).all())
        problems = conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all()
    assert sections == {
        "# Guide\n\nIntro.": None,  # the title's heading: said by the title
        "## Setup\n\nStep one.": None,  # its own heading opens it
        "Step one.": [{"level": 2, "text": "Setup"}],
        "Run it.": [{"level": 2, "text": "Setup"}, {"level": 3, "text": "Linux"}],
        "No headings here.": None}
    assert problems == []

    def lexemes(chunk: str) -> set[str]:
        with eng.connect() as conn:
            return set(conn.execute(text(
                "select tsvector_to_array(lexical) from sources.chunks where tenant_id = :t and text = :c"),
                {"t": tenant, "c": chunk}).scalar_one())

    assert lexemes("Run it.") == {"run", "setup"}  # the trail's outermost heading, backfilled
    migrate.downgrade(scratch_url, "0088_identity_functions_plpgsql")
    assert lexemes("Run it.") == {"run"}
    with eng.connect() as conn:
        assert conn.execute(text(
            "select count(*) from information_schema.columns where table_schema = 'sources' "
            "and table_name = 'chunks' and column_name = 'section'")).scalar_one() == 0
        assert conn.execute(text("select * from provenance.verify_rows(:t)"), {"t": tenant}).all() == []
    migrate.upgrade(scratch_url, "head")
    eng.dispose()
