"""Profiles: per person and per user, per scope set and perspective partition, rewritten only on change."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Profile
from orchestrator.db.session import bound_session
from orchestrator.derive import profiles
from orchestrator.derive.profiles import refresh
from orchestrator.derive.summarize import ExtractiveSummarizer, Summary
from orchestrator.ingest.knowledge import FactInput, assert_fact, resolve_entity
from tests.conftest import TenantFixture, TestDatabase

Tenants = Callable[..., TenantFixture]


def _say(app_engine: Engine, t: TenantFixture, user: str, subject: uuid.UUID, sentence: str,
         scopes: tuple[str, ...] = ("team",), kind: str = "world_fact") -> uuid.UUID:
    with bound_session(app_engine, t.identity(user, write=scopes)) as s:
        claim = assert_fact(s, FactInput(subject_id=subject, predicate="note", text=sentence, value=sentence,
                                         scopes=scopes, kind=kind))  # type: ignore[arg-type]
    assert claim.claim_id is not None
    return claim.claim_id


def _person(app_engine: Engine, t: TenantFixture, name: str,
            scopes: tuple[str, ...] = ("team",)) -> uuid.UUID:
    with bound_session(app_engine, t.identity(write=scopes)) as s:
        found = resolve_entity(s, "person", name, scopes)
    assert found is not None
    return found


def _profiles(app_engine: Engine, t: TenantFixture, read: tuple[str, ...]) -> list[Profile]:
    with bound_session(app_engine, t.identity("reader", read=read)) as s:
        return list(s.execute(select(Profile).order_by(Profile.id)).scalars())


def _events(admin_engine: Engine, t: TenantFixture) -> int:
    with admin_engine.connect() as conn:
        return int(conn.execute(text("select count(*) from provenance.events where tenant_id = :t"),
                                {"t": t.id}).scalar_one())


def _sources(admin_engine: Engine, t: TenantFixture, profile: uuid.UUID) -> list[str]:
    with admin_engine.connect() as conn:
        return sorted(conn.execute(text(
            "select source_row_id->>'id' from provenance.derivations where tenant_id = :t "
            "and derived_table = 'memory.profiles' and derived_row_id->>'id' = :p "
            "and derived_version = provenance.audit_row_version('memory.profiles', "
            "jsonb_build_object('id', :p), :t)"), {"t": t.id, "p": str(profile)}).scalars())


class Counting:
    """The extractive summarizer, counting calls (what an abstractive endpoint would be asked)."""

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.method, self.model = self.inner.method, self.inner.model
        self.calls = 0

    def summarize(self, sentences: Sequence[str], **kw: Any) -> Summary:
        self.calls += 1
        return self.inner.summarize(sentences, **kw)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Counting:
    summarizer = Counting()
    monkeypatch.setattr(profiles, "get_summarizer", lambda settings=None: summarizer)
    return summarizer


def test_profiles_per_scope_set_and_only_on_change(app_engine: Engine, admin_engine: Engine,
                                                   tenant_factory: Tenants) -> None:
    t = tenant_factory("team", "exec")
    both = t.identity(write=("team", "exec"))
    ada = _person(app_engine, t, "Ada Lovelace", ("team", "exec"))
    with bound_session(app_engine, both) as s:
        place = resolve_entity(s, "place", "London", ("team",))
    assert place is not None
    _say(app_engine, t, "alice", ada, "Ada Lovelace wrote the first program.")
    _say(app_engine, t, "alice", ada, "Ada Lovelace lived in London.")
    _say(app_engine, t, "alice", ada, "Ada Lovelace is negotiating a secret contract.", ("exec",))
    _say(app_engine, t, "alice", ada, "Ada Lovelace prefers tea.", kind="preference")
    _say(app_engine, t, "alice", place, "London is big.")
    with bound_session(app_engine, both) as s:
        first = refresh(s)
    # team world, exec world, Ada as alice sees her, and alice's own profile (both in team).
    assert (first.inserted, first.updated, first.unchanged, first.users) == (4, 0, 0, 1)
    team = _profiles(app_engine, t, ("team",))
    world = [p for p in team if p.perspective_key == "world"]
    assert len(world) == 1 and world[0].scopes == [t.scopes["team"]]
    assert world[0].subject_entity_id == ada and world[0].summary.startswith("Ada Lovelace: ")
    assert "first program" in world[0].summary
    assert "secret" not in world[0].summary and "tea" not in world[0].summary  # no exec, no preference
    view = next(p for p in team if p.subject_entity_id == ada and p.perspective_key == "user:alice")
    assert view.summary == "Ada Lovelace, as alice sees it: Ada Lovelace prefers tea."
    mine = next(p for p in team if p.subject_user_id == "alice")
    assert mine.perspective_key == "user:alice" and "prefers tea" in mine.summary
    exec_ = _profiles(app_engine, t, ("exec",))
    assert len(exec_) == 1 and "secret" in exec_[0].summary
    with bound_session(app_engine, both) as s:
        again = refresh(s)
    assert (again.inserted, again.updated, again.unchanged, again.resummarised) == (0, 0, 4, 0)
    with admin_engine.begin() as conn:  # as if the worker had embedded every profile
        conn.execute(text("update memory.profiles set embedding = array_fill(0.1, array[384])::vector, "
                          "embed_state = 'ready' where tenant_id = :t"), {"t": t.id})
    _say(app_engine, t, "alice", ada, "Ada Lovelace met Babbage.", ("exec",))
    with bound_session(app_engine, both) as s:
        third = refresh(s)
        states = dict(s.execute(select(Profile.id, Profile.embed_state)).all())
        kept = s.execute(select(Profile.summary).where(Profile.id == world[0].id)).scalar_one()
    assert (third.inserted, third.updated, third.unchanged, third.resummarised) == (0, 1, 3, 1)
    assert states[exec_[0].id] == "pending"  # the changed profile goes back on the embedding queue
    assert kept == world[0].summary
    assert {k for k, v in states.items() if v == "ready"} == {world[0].id, view.id, mine.id}
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert refresh(s).inserted == 0
        assert s.execute(select(Profile)).scalars().all() == []


def test_perspectives_are_never_mixed_and_users_get_their_own(
        app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team", "exec")
    ada = _person(app_engine, t, "Ada Lovelace", ("team", "exec"))
    grace = _person(app_engine, t, "Grace Hopper", ("team", "exec"))
    _say(app_engine, t, "alice", ada, "Ada Lovelace is a brilliant mathematician.", kind="opinion")
    _say(app_engine, t, "bob", ada, "Ada Lovelace is overrated as a programmer.", kind="opinion")
    _say(app_engine, t, "bob", grace, "Grace Hopper gave bob a nanosecond of wire.", kind="experience")
    _say(app_engine, t, "bob", ada, "Ada Lovelace should publish less.", ("exec",), kind="opinion")
    _say(app_engine, t, "carol", ada, "Ada Lovelace was born in 1815.")
    with bound_session(app_engine, t.identity("service", write=("team", "exec"))) as s:
        report = refresh(s)
    team = _profiles(app_engine, t, ("team",))
    by = {(p.subject_entity_id, p.subject_user_id, p.perspective_key): p for p in team}
    assert set(by) == {(ada, None, "world"), (ada, None, "user:alice"), (ada, None, "user:bob"),
                       (grace, None, "user:bob"), (None, "alice", "user:alice"), (None, "bob", "user:bob")}
    alice_view, bob_view = by[(ada, None, "user:alice")].summary, by[(ada, None, "user:bob")].summary
    assert "brilliant" in alice_view and "overrated" not in alice_view
    assert "overrated" in bob_view and "brilliant" not in bob_view and "publish" not in bob_view
    world = by[(ada, None, "world")].summary
    assert "1815" in world and "brilliant" not in world and "overrated" not in world
    bob = by[(None, "bob", "user:bob")].summary
    assert "overrated" in bob and "nanosecond" in bob and "brilliant" not in bob
    assert by[(None, "alice", "user:alice")].summary == "alice, in their own words: " \
        "Ada Lovelace is a brilliant mathematician."
    # bob's exec opinion stays in an exec profile, which a team-only reader never sees.
    exec_ = _profiles(app_engine, t, ("exec",))
    assert {(p.subject_entity_id, p.subject_user_id) for p in exec_} == {(ada, None), (None, "bob")}
    assert all("publish" in p.summary and "overrated" not in p.summary for p in exec_)
    assert report.users == 3
    assert _profiles(app_engine, tenant_factory("team"), ("team",)) == []


def test_unchanged_input_is_not_summarised_again_and_lineage_follows_each_version(
        app_engine: Engine, admin_engine: Engine, tenant_factory: Tenants, counting: Counting) -> None:
    t = tenant_factory("team")
    ident = t.identity(write=("team",))
    ada = _person(app_engine, t, "Ada Lovelace")
    grace = _person(app_engine, t, "Grace Hopper")
    first_claims = [_say(app_engine, t, "alice", ada, "Ada Lovelace wrote notes on the engine."),
                    _say(app_engine, t, "alice", ada, "Ada Lovelace translated Menabrea.")]
    grace_claim = _say(app_engine, t, "alice", grace, "Grace Hopper built a compiler.")
    with bound_session(app_engine, ident) as s:
        assert refresh(s).inserted == 2
    assert counting.calls == 2
    rows = {p.subject_entity_id: p for p in _profiles(app_engine, t, ("team",))}
    assert _sources(admin_engine, t, rows[ada].id) == sorted(str(c) for c in first_claims)
    assert _sources(admin_engine, t, rows[grace].id) == [str(grace_claim)]
    events = _events(admin_engine, t)
    with bound_session(app_engine, ident) as s:
        again = refresh(s)
    assert counting.calls == 2 and again.resummarised == 0 and again.unchanged == 2
    assert _events(admin_engine, t) == events  # a quiet run writes nothing at all

    # A new claim about Ada: exactly one summarizer call, her profile only.
    new = _say(app_engine, t, "alice", ada, "Ada Lovelace corresponded with Babbage.")
    with bound_session(app_engine, ident) as s:
        third = refresh(s)
    assert counting.calls == 3 and (third.updated, third.unchanged) == (1, 1)
    after = {p.subject_entity_id: p for p in _profiles(app_engine, t, ("team",))}
    assert after[ada].input_digest != rows[ada].input_digest and after[ada].updated_at > rows[ada].updated_at
    assert after[grace].input_digest == rows[grace].input_digest
    assert after[grace].updated_at == rows[grace].updated_at
    # The new version of Ada's profile is derived from all three claims; Grace's edges stay as they were.
    assert _sources(admin_engine, t, after[ada].id) == sorted(str(c) for c in [*first_claims, new])
    assert _sources(admin_engine, t, after[grace].id) == [str(grace_claim)]

    # Another summary method (e.g. an endpoint configured) re-summarises even an unchanged input.
    counting.method = "abstractive:test"
    with bound_session(app_engine, ident) as s:
        fourth = refresh(s)
    assert counting.calls == 5 and fourth.resummarised == 2

    # A new form of the extractive summary (summarize.FORM) makes every summary once more.
    from orchestrator.derive import summarize

    counting.method = counting.inner.method  # the method stored: extractive again
    with bound_session(app_engine, ident) as s:
        refresh(s)
    counting.calls = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(summarize, "FORM", summarize.FORM + 1)
        with bound_session(app_engine, ident) as s:
            fifth = refresh(s)
        with bound_session(app_engine, ident) as s:
            sixth = refresh(s)
    assert (fifth.resummarised, sixth.resummarised, counting.calls) == (2, 0, 2), (fifth, sixth)


def test_a_profile_whose_facts_are_gone_is_deleted(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    ada = _person(app_engine, t, "Ada Lovelace")
    claim = _say(app_engine, t, "alice", ada, "Ada Lovelace wrote notes.")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        refresh(s)
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        s.execute(text("delete from knowledge.fact_claim where id = :c"), {"c": claim})
        gone = refresh(s)
    assert gone.deleted == 1 and _profiles(app_engine, t, ("team",)) == []


def test_a_profile_of_an_entity_no_longer_a_person_is_deleted(app_engine: Engine,
                                                              tenant_factory: Tenants) -> None:
    """Newer extraction rules retype a "person" ("Long Term Support" is a product since rules
    20), and an entity may be merged into another: its profile goes on the next run (it stayed
    and was served as a person's until stop 45). A person's profile beside it stays."""
    t = tenant_factory("team")
    lts = _person(app_engine, t, "Long Term Support")
    old = _person(app_engine, t, "A. Lovelace")
    ada = _person(app_engine, t, "Ada Lovelace")
    _say(app_engine, t, "alice", lts, "Long Term Support guarantees 30-month support cycles.")
    _say(app_engine, t, "alice", old, "A. Lovelace wrote the first program.")
    _say(app_engine, t, "alice", ada, "Ada Lovelace lived in London.")
    ident = t.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        assert refresh(s).inserted == 3
    with bound_session(app_engine, ident) as s:
        s.execute(text("update knowledge.entities set entity_type = 'product' where id = :e"),
                  {"e": lts})
        s.execute(text("select knowledge.merge_entities(:s, :m)"), {"s": ada, "m": old})
    with bound_session(app_engine, ident) as s:
        report = refresh(s)
    assert report.deleted == 2, report
    left = _profiles(app_engine, t, ("team",))
    assert [p.subject_entity_id for p in left] == [ada], [p.summary for p in left]
    assert left[0].summary.startswith("Ada Lovelace: ")


def test_two_concurrent_runs_write_each_profile_once(app_engine: Engine, tenant_factory: Tenants) -> None:
    from tests.support.derive import race

    t = tenant_factory("team")
    for i in range(3):
        person = _person(app_engine, t, f"Person {i}")
        _say(app_engine, t, "alice", person, f"Person {i} likes chess.", kind="opinion")
    ident = t.identity(write=("team",))

    def run(progress: Callable[[int, int], None]) -> object:
        with bound_session(app_engine, ident) as s:
            return refresh(s, on_progress=progress)

    reports = race(run)
    assert sorted(r.inserted for r in reports) == [0, 4]  # type: ignore[attr-defined]
    assert len(_profiles(app_engine, t, ("team",))) == 4


def test_killed_run_then_rerun_completes_without_duplicates(
        test_db: TestDatabase, app_engine: Engine, admin_engine: Engine, tenant_factory: Tenants) -> None:
    from tests.support.killed_run import kill_midway

    t = tenant_factory("team")
    for i in range(3):
        _say(app_engine, t, "alice", _person(app_engine, t, f"Person {i}"), f"Person {i} plays go.")
    killed = kill_midway(test_db.database.app_url(), {"org": t.org_id, "user": "alice", "write": ["team"]},
                         "profiles", "memory.profiles", after=2)
    assert killed.returncode == -signal.SIGKILL, killed.stdout + killed.stderr
    assert _profiles(app_engine, t, ("team",)) == []
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert refresh(s).inserted == 3
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert refresh(s).inserted == 0
    assert len(_profiles(app_engine, t, ("team",))) == 3


def test_a_user_profile_cannot_be_put_in_another_partition(app_engine: Engine,
                                                           tenant_factory: Tenants) -> None:
    from sqlalchemy import insert

    t = tenant_factory("team")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        pid = s.execute(insert(Profile).values(subject_user_id="bob", perspective_key="user:alice",
                                               summary="bob likes tea", scopes=[t.scopes["team"]])
                        .returning(Profile.perspective_key)).scalar_one()
    assert pid == "user:bob"
