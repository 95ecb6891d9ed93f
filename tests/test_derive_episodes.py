"""Episodes from working-memory sessions: bounded, incremental, private to the items' owner."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Episode, WorkingMemoryItem
from orchestrator.db.session import bound_session
from orchestrator.derive.episodes import build
from orchestrator.derive.service import ServiceTenant, service_session
from orchestrator.errors import BadInput
from orchestrator.ingest.memory import add_working_memory
from tests.conftest import TenantFixture
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]
Dialogue = tuple[TenantFixture, list[uuid.UUID], list[uuid.UUID]]


def _say(app_engine: Engine, t: TenantFixture, user: str, texts: list[str], *, session_id: str = "s1",
         scopes: tuple[str, ...] = ("team",)) -> list[uuid.UUID]:
    ids = []
    for line in texts:  # one transaction each: every item gets its own created_at
        with bound_session(app_engine, t.identity(user, write=scopes)) as s:
            ids.append(add_working_memory(s, session_id, line, scopes))
    return ids


def _service(t: TenantFixture) -> ServiceTenant:
    return ServiceTenant(t.id, t.org_id, tuple(sorted(t.scopes)))


def _counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int]:
    with admin_engine.connect() as conn:
        found = tuple(int(conn.execute(text(sql), {"t": t.id}).scalar_one()) for sql in (
            "select count(*) from memory.episodes where tenant_id = :t",
            "select count(*) from provenance.events where tenant_id = :t"))
    return found  # type: ignore[return-value]


@pytest.fixture
def dialogue(app_engine: Engine, tenant_factory: Tenants) -> Dialogue:
    t = tenant_factory("team", "exec")
    alice = _say(app_engine, t, "alice", [
        "We should move the queue to PostgreSQL.", "SKIP LOCKED makes claiming rows safe.",
        "Redis would be one more system to run.", "The migration needs a weekend.",
        "Alice will write the design note."])
    bob = _say(app_engine, t, "bob", ["Bob's salary review is on Friday.", "Bob asked for a raise."])
    return t, alice, bob


def test_bounded_episodes_with_span_and_lineage(app_engine: Engine, admin_engine: Engine,
                                                dialogue: Dialogue) -> None:
    t, alice, bob = dialogue
    with service_session(app_engine, _service(t)) as s:
        report = build(s, max_items=3)
        episodes = s.execute(select(Episode).order_by(Episode.user_id, Episode.started_at)).scalars().all()
        items = {w.id: w for w in s.execute(select(WorkingMemoryItem)).scalars()}
    assert (report.inserted, report.updated, report.sessions, report.items) == (3, 0, 2, 7)
    assert [(e.user_id, e.source_item_ids) for e in episodes] == [
        ("alice", alice[:3]), ("alice", alice[3:]), ("bob", bob)]
    for e in episodes:
        assert e.private and e.session_id == "s1" and e.scopes == [t.scopes["team"]]
        assert e.turn_count == len(e.source_item_ids) <= 3
        assert e.started_at == items[e.source_item_ids[0]].created_at
        assert e.ended_at == items[e.source_item_ids[-1]].created_at > e.started_at
        assert e.summary_method.startswith("extractive:") and e.summary
    assert "raise" in episodes[2].summary or "salary" in episodes[2].summary
    with admin_engine.connect() as conn:
        edges = conn.execute(text(
            "select derived_row_id ->> 'id', source_row_id ->> 'id' from provenance.derivations "
            "where tenant_id = :t and derived_table = 'memory.episodes' "
            "and source_table = 'memory.working_memory'"), {"t": t.id}).all()
        actor = conn.execute(text(
            "select distinct actor_user from provenance.events where tenant_id = :t "
            "and table_name = 'memory.episodes'"), {"t": t.id}).scalars().all()
    assert {(uuid.UUID(e), uuid.UUID(i)) for e, i in edges} == {
        (e.id, i) for e in episodes for i in e.source_item_ids}
    assert actor == ["service:derive"]


def test_an_episode_is_readable_only_by_its_user(app_engine: Engine, tenant_factory: Tenants,
                                                 dialogue: Dialogue) -> None:
    t, _, _ = dialogue
    with service_session(app_engine, _service(t)) as s:
        build(s, max_items=3)
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        mine = s.execute(select(Episode.user_id)).scalars().all()
    with bound_session(app_engine, t.identity("bob", write=("team", "exec"))) as s:
        his = s.execute(select(Episode.summary)).scalars().all()
    with bound_session(app_engine, t.identity("carol", read=("team",))) as s:
        assert s.execute(select(Episode)).scalars().all() == []  # shares the scope, not the sessions
    assert mine == ["alice", "alice"]
    assert len(his) == 1 and not any("PostgreSQL" in x for x in his)
    with bound_session(app_engine, t.identity("alice", read=("exec",))) as s:
        assert s.execute(select(Episode)).scalars().all() == []  # her own, but not in this scope
    other = tenant_factory("team")
    with service_session(app_engine, _service(other)) as s:
        assert build(s).inserted == 0
        assert s.execute(select(Episode)).scalars().all() == []


def test_rerun_changes_nothing_and_growth_touches_only_that_session(
        app_engine: Engine, admin_engine: Engine,
        dialogue: Dialogue) -> None:
    t, alice, bob = dialogue
    with service_session(app_engine, _service(t)) as s:
        build(s, max_items=3)
        before = {e.id: (e.summary, e.source_item_ids, e.ended_at)
                  for e in s.execute(select(Episode)).scalars()}
    counts = _counts(admin_engine, t)
    with service_session(app_engine, _service(t)) as s:
        again = build(s, max_items=3)
    assert (again.inserted, again.updated, again.items) == (0, 0, 0)
    assert _counts(admin_engine, t) == counts
    more = _say(app_engine, t, "alice", ["Bob agreed to review the note.", "We ship in March."])
    with service_session(app_engine, _service(t)) as s:
        grown = build(s, max_items=3)
        after = {e.id: (e.summary, e.source_item_ids, e.ended_at)
                 for e in s.execute(select(Episode)).scalars()}
    assert (grown.inserted, grown.updated, grown.sessions, grown.items) == (1, 1, 1, 2)
    changed = {i for i in before if after[i] != before[i]}
    assert len(changed) == 1  # alice's open episode, nothing else
    (open_,) = changed
    assert after[open_][1] == alice[3:] + more[:1]
    new = set(after) - set(before)
    assert [after[i][1] for i in new] == [more[1:]]
    untouched = [i for i in before if before[i][1] == bob]
    assert after[untouched[0]] == before[untouched[0]]


def test_a_user_builds_only_their_own_and_scope_sets_stay_apart(
        app_engine: Engine, dialogue: Dialogue) -> None:
    t, alice, _ = dialogue
    secret = _say(app_engine, t, "alice", ["The acquisition closes in May."], scopes=("exec",))
    with bound_session(app_engine, t.identity("alice", write=("team", "exec"))) as s:
        report = build(s, max_items=10)
        episodes = s.execute(select(Episode.scopes, Episode.source_item_ids, Episode.user_id)).all()
    assert report.inserted == 2 and report.items == 6  # bob's items are not hers to read
    assert sorted((tuple(sc), tuple(ids)) for sc, ids, _ in episodes) == sorted([
        ((t.scopes["team"],), tuple(alice)), ((t.scopes["exec"],), tuple(secret))])
    with service_session(app_engine, _service(t)) as s:
        rest = build(s, max_items=10)
        bobs = s.execute(select(Episode.user_id).where(Episode.user_id == "bob")).scalars().all()
    assert (rest.inserted, rest.items) == (1, 2) and bobs == ["bob"]


def test_killed_mid_run_then_restarted_has_no_duplicates(
        app_engine: Engine, admin_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        dialogue: Dialogue) -> None:
    import orchestrator.derive.episodes as job
    from orchestrator.audit.lineage import record_derivation as real

    t, alice, bob = dialogue
    calls = [0]

    def crash_on_second(*args: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt("killed")
        return real(*args, **kw)  # type: ignore[arg-type]

    counts = _counts(admin_engine, t)
    monkeypatch.setattr(job, "record_derivation", crash_on_second)
    with pytest.raises(KeyboardInterrupt), service_session(app_engine, _service(t)) as s:
        build(s, max_items=3)
    assert _counts(admin_engine, t) == counts
    monkeypatch.setattr(job, "record_derivation", real)
    with service_session(app_engine, _service(t)) as s:
        assert build(s, max_items=3).inserted == 3
        listed = [i for ids in s.execute(select(Episode.source_item_ids)).scalars() for i in ids]
    assert sorted(listed) == sorted(alice + bob)  # every item in exactly one episode


def test_bad_input_is_refused_and_writes_nothing(app_engine: Engine, admin_engine: Engine,
                                                 dialogue: Dialogue) -> None:
    t, _, _ = dialogue
    counts = _counts(admin_engine, t)
    for bad in (0, -1, 1001, True):
        with pytest.raises(BadInput, match="max_items must be an integer from 1 to 1000"), \
                service_session(app_engine, _service(t)) as s:
            build(s, max_items=bad)
    assert _counts(admin_engine, t) == counts


def test_cli_episodes(cli_env: dict[str, str],  # noqa: F811
                      dialogue: Dialogue) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    t, _, _ = dialogue
    who = ["--tenant", t.org_id, "--user", "alice", "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "episodes", "--max-items", "2", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("episodes: 3 inserted, 0 updated from 5 new items in 1 sessions")
    again = CliRunner().invoke(app, ["derive", "episodes", *who], env=cli_env)
    assert again.output.startswith("episodes: 0 inserted, 0 updated from 0 new items")
    bad = CliRunner().invoke(app, ["derive", "episodes", "--max-items", "0", *who], env=cli_env)
    assert bad.exit_code == 2 and "max_items must be an integer from 1 to 1000" in bad.output
