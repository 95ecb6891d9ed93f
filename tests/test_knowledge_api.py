"""The knowledge Python API end to end on the real server, under the bound identity's RLS."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput, Forbidden, NotFound
from orchestrator.ingest import knowledge as kn
from orchestrator.ingest import memory as mem
from tests.conftest import TenantFixture
from tests.support.knowledge import counts, define_shape, strict_shapes


@pytest.fixture
def tenant(tenant_factory: Callable[..., TenantFixture]) -> TenantFixture:
    return tenant_factory("team", "private")


def _writer(t: TenantFixture, user: str = "alice") -> Any:
    return t.identity(user, write=("team",))


def _entity(app_engine: Engine, t: TenantFixture, name: str, kind: str = "person") -> uuid.UUID:
    with bound_session(app_engine, _writer(t)) as s:
        eid = kn.resolve_entity(s, kind, name, ["team"])
    assert eid is not None
    return eid


def _fact(subject: uuid.UUID, predicate: str, value: Any, **kw: Any) -> kn.FactInput:
    return kn.FactInput(subject_id=subject, predicate=predicate, value=value,
                        text=kw.pop("text", f"{predicate} {value}"), scopes=kw.pop("scopes", ("team",)),
                        **kw)


def test_assert_read_keyed_and_relation(app_engine: Engine, tenant: TenantFixture) -> None:
    ann = _entity(app_engine, tenant, "Ann Lee")
    acme = _entity(app_engine, tenant, "Acme", "org")
    with bound_session(app_engine, _writer(tenant)) as s:
        prose = kn.assert_fact(s, _fact(ann, "title", "intern", authority=80))
        keyed = kn.assert_keyed_fact(s, _fact(ann, "title", "staff engineer"), fact_key="hr.ann.title",
                                     as_of="2025-01-01T00:00:00+00:00", authority=50)
        rel = kn.assert_relation(s, ann, "works_for", acme, "Ann works for Acme", ["team"])
        born = kn.assert_fact(s, _fact(ann, "born_on", datetime(1990, 5, 1, tzinfo=UTC).date()))
    assert prose.claim_id and keyed.claim_id and rel.claim_id and born.claim_id
    reader = tenant.identity("rita", read=("team",))
    with bound_session(app_engine, reader) as s:
        facts = kn.current_facts(s, ann)
        everything = kn.current_facts(s, ann, include_beaten=True)
        assert kn.touch_facts(s, [f.id for f in facts]) == 3
    by_predicate = {f.predicate: f for f in facts}
    assert set(by_predicate) == {"born_on", "title", "works_for"}
    assert by_predicate["title"].object_value == "staff engineer", "the keyed fact beats prose"
    assert by_predicate["works_for"].object_id == acme
    assert by_predicate["works_for"].object_datatype == "entity"
    assert by_predicate["born_on"].object_datatype == "date"
    beaten = [f for f in everything if f.beaten_by is not None]
    assert [(f.object_value, f.beaten_by) for f in beaten] == [("intern", keyed.claim_id)]
    assert all(f.author == "alice" and f.perspective_key == "world" for f in facts)


def test_entity_resolution_is_normalised(app_engine: Engine, tenant: TenantFixture) -> None:
    with bound_session(app_engine, _writer(tenant)) as s:
        first = kn.resolve_entity(s, "person", "Ann  Lee", ["team"])
        assert first is not None
        assert kn.resolve_entity(s, "person", "ann lee.", ["team"]) == first
        assert kn.resolve_entity(s, "person", "ANN LEE", ["team"]) == first
        kn.add_aliases(s, first, ["Annie"])
        assert kn.resolve_entity(s, "person", " annie ", ["team"]) == first, "alias match"
        other_type = kn.resolve_entity(s, "org", "Ann Lee", ["team"])
        assert other_type not in (None, first), "same name, other type: another entity"
        assert kn.resolve_entity(s, "person", "Nobody Here", create=False) is None
    with bound_session(app_engine, tenant.identity("rita", read=("team",))) as s:
        assert kn.resolve_entity(s, "person", "annie", create=False) == first
    with pytest.raises(Forbidden), \
            bound_session(app_engine, tenant.identity("rita", read=("team",))) as s:
        kn.resolve_entity(s, "person", "New Person", ["team"])


def test_concurrent_resolution_makes_one_entity(app_engine: Engine, admin_engine: Engine,
                                                tenant: TenantFixture) -> None:
    start = threading.Barrier(3)
    found: list[uuid.UUID | None] = []
    errors: list[BaseException] = []

    def resolve(user: str, spelling: str) -> None:
        try:
            with bound_session(app_engine, _writer(tenant, user)) as s:
                start.wait(timeout=10)
                found.append(kn.resolve_entity(s, "person", spelling, ["team"]))
                time.sleep(0.3)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=resolve, args=(u, n))
               for u, n in (("alice", "Zoe Quinn"), ("bruno", "zoe  quinn"), ("carla", "ZOE QUINN."))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert not errors, errors
    assert len(set(found)) == 1 and None not in found
    assert counts(admin_engine, tenant.id)["knowledge.entities"] == 1


def test_merge_repoints_claims_and_keeps_the_old_id(app_engine: Engine, admin_engine: Engine,
                                                    tenant: TenantFixture) -> None:
    robert = _entity(app_engine, tenant, "Robert Smith")
    bob = _entity(app_engine, tenant, "Bob Smith")
    acme = _entity(app_engine, tenant, "Acme", "org")
    with bound_session(app_engine, _writer(tenant)) as s:
        kn.assert_fact(s, _fact(bob, "hobby", "chess"))
        kn.assert_relation(s, acme, "employs", bob, "Acme employs Bob", ["team"])
        assert kn.merge_entities(s, robert, bob) == robert
        assert kn.canonical_entity(s, bob) == robert, "the merged-away id stays resolvable"
        assert kn.resolve_entity(s, "person", "bob smith", ["team"]) == robert, "its name became an alias"
        facts = kn.current_facts(s, bob)
        assert {f.predicate for f in facts} == {"hobby"}
        assert all(f.subject_id == robert for f in facts)
        later = kn.assert_fact(s, _fact(bob, "sport", "tennis"))
        with pytest.raises(NotFound):
            kn.merge_entities(s, robert, bob)
    with admin_engine.connect() as conn:
        rows = conn.execute(text("select subject_id, object_id from knowledge.fact_claim "
                                 "where tenant_id = :t"), {"t": tenant.id}).all()
    assert bob not in {r.subject_id for r in rows} | {r.object_id for r in rows}, "claims repointed"
    assert later.claim_id is not None


def test_quarantine_and_release(app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    define_shape(admin_engine, tenant.id, "level", allowed_values=["junior", "senior"])
    strict_shapes(admin_engine, tenant.id)
    ann = _entity(app_engine, tenant, "Ann")
    with bound_session(app_engine, _writer(tenant)) as s:
        held = kn.assert_fact(s, _fact(ann, "level", "wizard"))
        unknown = kn.assert_fact(s, _fact(ann, "shoe_size", "42"))
        assert held.quarantined and held.claim_id is None
        assert held.reasons == ("value 'wizard' of predicate level is not one of: junior, senior",)
        assert unknown.reasons == ("unknown predicate shoe_size: this tenant accepts only predicates "
                                   "with a shape",)
        assert [q.id for q in kn.quarantine(s)] == [held.quarantine_id, unknown.quarantine_id]
        again = kn.release_quarantine(s, held.quarantine_id, {"object_value": "still a wizard"})  # type: ignore[arg-type]
        assert again.quarantined and "still a wizard" in again.reasons[0]
        released = kn.release_quarantine(s, held.quarantine_id, {"object_value": "senior"})  # type: ignore[arg-type]
        assert released.claim_id is not None
        assert [f.object_value for f in kn.current_facts(s, ann)] == ["senior"]
        assert [q.id for q in kn.quarantine(s)] == [unknown.quarantine_id]
        with pytest.raises(BadInput, match="cannot correct scopes"):
            kn.release_quarantine(s, unknown.quarantine_id, {"scopes": []})  # type: ignore[arg-type]
    with bound_session(app_engine, tenant.identity("mallory", write=("private",))) as s:
        assert kn.quarantine(s) == [], "quarantine is visible to its writer, not to others"


def test_dry_run_shape_reports_and_changes_nothing(app_engine: Engine, admin_engine: Engine,
                                                   tenant: TenantFixture) -> None:
    ann = _entity(app_engine, tenant, "Ann")
    bob = _entity(app_engine, tenant, "Bob")
    with bound_session(app_engine, _writer(tenant)) as s:
        ok = kn.assert_fact(s, _fact(ann, "email", "ann@example.org"))
        bad = kn.assert_fact(s, _fact(bob, "email", "bob at example"))
    before = counts(admin_engine, tenant.id)
    with bound_session(app_engine, _writer(tenant)) as s:
        report = kn.dry_run_shape(s, "email", value_pattern=r"^[^@ ]+@[^@ ]+$")
        minimum = kn.dry_run_shape(s, "email", subject_type="person", min_count=2)
        with pytest.raises(BadInput, match="predicate"):
            kn.dry_run_shape(s, "Not A Predicate")
    assert [(v.claim_id, v.subject_id) for v in report] == [(bad.claim_id, bob)]
    assert "does not match the pattern" in report[0].reasons[0]
    assert {v.subject_id for v in minimum} == {ann, bob} and ok.claim_id is not None
    assert counts(admin_engine, tenant.id) == before
    with admin_engine.connect() as conn:
        assert conn.execute(text("select count(*) from knowledge.shapes where tenant_id = :t"),
                            {"t": tenant.id}).scalar_one() == 0


def _bad_inputs(other_tenant_entity: uuid.UUID) -> list[tuple[str, dict[str, Any], str]]:
    """Refused as bad input (``BadInput``); another tenant's ids are not found (``NotFound``)."""
    return [
        ("confidence above 1", {"confidence": 1.5}, r"confidence 1\.5 is outside \[0, 1\]"),
        ("negative confidence", {"confidence": -0.1}, r"outside \[0, 1\]"),
        ("valid_to before valid_from", {"valid_from": "2024-05-01T00:00:00+00:00",
                                        "valid_to": "2024-01-01T00:00:00+00:00"}, "is not after valid_from"),
        ("malformed date", {"valid_from": "2024-13-45"}, "is not an ISO 8601 date"),
        ("date without zone", {"valid_from": "2024-01-01T10:00:00"}, "has no time zone"),
        ("malformed date literal (checked by the database)", {"value": "1990-02-30", "datatype": "date"},
         "is not a valid date"),
        ("entity of another tenant", {"subject_id": other_tenant_entity},
         "not found: entity .* does not exist in this tenant or is not visible"),
        ("object entity of another tenant", {"value": None, "object_id": other_tenant_entity},
         "not found: entity .* does not exist in this tenant"),
        ("no object at all", {"value": None}, "exactly one object"),
        ("unknown scope", {"scopes": ("nope",)}, "unknown scope"),
    ]


def test_bad_input_is_refused_and_nothing_changes(app_engine: Engine, admin_engine: Engine,
                                                  tenant: TenantFixture,
                                                  tenant_factory: Callable[..., TenantFixture]) -> None:
    other = tenant_factory("team")
    foreign = _entity(app_engine, other, "Foreigner")
    ann = _entity(app_engine, tenant, "Ann")
    with bound_session(app_engine, _writer(tenant)) as s:
        kn.assert_fact(s, _fact(ann, "level", "junior"))
    before = counts(admin_engine, tenant.id)
    for label, change, message in _bad_inputs(foreign):
        fields: dict[str, Any] = {"subject_id": ann, "predicate": "level", "value": "x",
                                  "text": f"bad: {label}", "scopes": ("team",), **change}
        expected = NotFound if message.startswith("not found: ") else BadInput
        with pytest.raises(expected, match=message.removeprefix("not found: ")), \
                bound_session(app_engine, _writer(tenant)) as s:
            kn.assert_fact(s, kn.FactInput(**fields))
        assert counts(admin_engine, tenant.id) == before, f"{label}: something was written"
    assert counts(admin_engine, other.id)["knowledge.fact_claim"] == 0


def test_shape_violations_are_quarantined_not_lost(app_engine: Engine, admin_engine: Engine,
                                                   tenant: TenantFixture) -> None:
    define_shape(admin_engine, tenant.id, "born_on", datatype="date")
    strict_shapes(admin_engine, tenant.id)
    ann = _entity(app_engine, tenant, "Ann")
    before = counts(admin_engine, tenant.id)
    with bound_session(app_engine, _writer(tenant)) as s:
        wrong_type = kn.assert_fact(s, _fact(ann, "born_on", 1990))
        unknown = kn.assert_fact(s, _fact(ann, "eye_colour", "green"))
    assert wrong_type.reasons == ("predicate born_on expects datatype date, not integer",)
    assert unknown.quarantined
    after = counts(admin_engine, tenant.id)
    assert after["knowledge.fact_claim"] == before["knowledge.fact_claim"]
    assert after["knowledge.quarantine"] == before["knowledge.quarantine"] + 2


def test_perspectives_and_conflict_resolution(app_engine: Engine, admin_engine: Engine,
                                              tenant: TenantFixture) -> None:
    define_shape(admin_engine, tenant.id, "lives_in", max_count=1)
    ann = _entity(app_engine, tenant, "Ann")
    with bound_session(app_engine, _writer(tenant, "alice")) as s:
        kn.assert_fact(s, _fact(ann, "lives_in", "Lisbon", kind="opinion"))
        old = kn.assert_fact(s, _fact(ann, "lives_in", "Porto"))
    with bound_session(app_engine, _writer(tenant, "bruno")) as s:
        kn.assert_fact(s, _fact(ann, "lives_in", "Faro", kind="opinion"))
        new = kn.assert_fact(s, _fact(ann, "lives_in", "Braga"))
        found = kn.conflicts(s)
        assert [(c.kind, c.perspective_key, {c.claim_a, c.claim_b}) for c in found] == [
            ("value", "world", {old.claim_id, new.claim_id})], "opinions coexist, world facts conflict"
        assert kn.detect_conflicts(s) == 0
        with pytest.raises(BadInput, match="manual resolution names"):
            kn.resolve_conflict(s, found[0].id, "manual")
        assert kn.resolve_conflict(s, found[0].id, "newest_wins") == new.claim_id
        assert kn.conflicts(s, status="open") == []
        world = [f.object_value for f in kn.current_facts(s, ann) if f.perspective_key == "world"]
        assert world == ["Braga"]
    with admin_engine.connect() as conn:
        loser = conn.execute(text("select valid_to from knowledge.fact_claim where id = :i"),
                             {"i": old.claim_id}).scalar_one()
    assert loser is not None, "the loser's validity is closed, the row kept"


def test_concurrent_conflicting_writers_make_one_conflict(app_engine: Engine, admin_engine: Engine,
                                                          tenant: TenantFixture) -> None:
    define_shape(admin_engine, tenant.id, "capital", max_count=1)
    country = _entity(app_engine, tenant, "Freedonia", "place")
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def write(user: str, value: str) -> None:
        try:
            with bound_session(app_engine, _writer(tenant, user)) as s:
                start.wait(timeout=10)
                kn.assert_fact(s, _fact(country, "capital", value))
                # Hold the transaction open: without the partition lock each
                # writer would miss the other's uncommitted claim.
                time.sleep(0.5)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=("alice", "North City")),
               threading.Thread(target=write, args=("bruno", "South City"))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=30)
    assert not errors, errors
    with admin_engine.connect() as conn:
        n_claims, n_conflicts = conn.execute(text(
            "select (select count(*) from knowledge.fact_claim where tenant_id = :t), "
            "(select count(*) from knowledge.conflicts where tenant_id = :t)"), {"t": tenant.id}).one()
    assert (n_claims, n_conflicts) == (2, 1)


def test_memory_writes(app_engine: Engine, admin_engine: Engine, tenant: TenantFixture) -> None:
    now = datetime.now(UTC)
    with bound_session(app_engine, _writer(tenant)) as s:
        first = mem.record_decision(s, mem.DecisionInput("architecture", "where data lives",
                                                         "PostgreSQL owns it", 0.9, ("team",)))
        second = mem.record_decision(s, mem.DecisionInput("architecture", "indexes",
                                                          "follow the first", 0.7, ("team",)))
        mem.link_decisions(s, first, second, "precedent_for", ["team"])
        mem.record_episode(s, "sess-1", "We chose PostgreSQL.", now - timedelta(minutes=5), now,
                           ["team"], turn_count=4)
        mem.add_working_memory(s, "sess-1", "user prefers short answers", ["team"])
        assert mem.working_memory(s, "sess-1") == ["user prefers short answers"]
        with pytest.raises(BadInput, match="cannot end before it starts"):
            mem.record_episode(s, "sess-1", "x", now, now - timedelta(days=1), ["team"])
        with pytest.raises(BadInput, match=r"outside \[0, 1\]"):
            mem.record_decision(s, mem.DecisionInput("a", "b", "c", 2.0, ("team",)))
        with pytest.raises(BadInput, match="linked to itself"):
            mem.link_decisions(s, first, first, "caused", ["team"])
        with pytest.raises(NotFound, match="decision .* does not exist in this tenant"):
            mem.link_decisions(s, first, uuid.uuid4(), "caused", ["team"])
    with bound_session(app_engine, _writer(tenant, "bruno")) as s:
        assert mem.working_memory(s) == [], "working memory is private to its user"
    c = counts(admin_engine, tenant.id)
    assert (c["memory.decisions"], c["memory.episodes"], c["memory.working_memory"]) == (2, 1, 1)
