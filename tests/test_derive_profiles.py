"""Profiles of person entities: per scope set, world facts only, rewritten only on change."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Profile
from orchestrator.db.session import bound_session
from orchestrator.derive.profiles import refresh
from orchestrator.ingest.knowledge import FactInput, assert_fact, resolve_entity
from tests.conftest import TenantFixture

Tenants = Callable[..., TenantFixture]


def test_profiles_per_scope_set_and_only_on_change(app_engine: Engine, admin_engine: Engine,
                                                   tenant_factory: Tenants) -> None:
    t = tenant_factory("team", "exec")
    both = t.identity(write=("team", "exec"))
    with bound_session(app_engine, both) as s:
        ada = resolve_entity(s, "person", "Ada Lovelace", ("team", "exec"))
        place = resolve_entity(s, "place", "London", ("team",))
        assert ada is not None and place is not None
        for text_, scopes, kind in [
                ("Ada Lovelace wrote the first program.", ("team",), "world_fact"),
                ("Ada Lovelace lived in London.", ("team",), "world_fact"),
                ("Ada Lovelace is negotiating a secret contract.", ("exec",), "world_fact"),
                ("Ada Lovelace prefers tea.", ("team",), "preference")]:
            assert assert_fact(s, FactInput(subject_id=ada, predicate="note", text=text_, value=text_,
                                            scopes=scopes, kind=kind)).claim_id is not None  # type: ignore[arg-type]
        assert assert_fact(s, FactInput(subject_id=place, predicate="note", text="London is big.",
                                        value="big", scopes=("team",))).claim_id is not None
        first = refresh(s)
    assert (first.inserted, first.updated, first.unchanged) == (2, 0, 0)
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        team = s.execute(select(Profile)).scalars().all()
    assert len(team) == 1 and team[0].scopes == [t.scopes["team"]]
    assert team[0].subject_entity_id == ada and team[0].summary.startswith("Ada Lovelace: ")
    assert "first program" in team[0].summary
    assert "secret" not in team[0].summary and "tea" not in team[0].summary  # no exec, no preference
    with bound_session(app_engine, t.identity(read=("exec",))) as s:
        exec_ = s.execute(select(Profile)).scalars().all()
    assert len(exec_) == 1 and "secret" in exec_[0].summary
    with bound_session(app_engine, both) as s:
        again = refresh(s)
    assert (again.inserted, again.updated, again.unchanged) == (0, 0, 2)
    with admin_engine.begin() as conn:  # as if the worker had embedded both profiles
        conn.execute(text("update memory.profiles set embedding = array_fill(0.1, array[384])::vector, "
                          "embed_state = 'ready' where tenant_id = :t"), {"t": t.id})
    with bound_session(app_engine, both) as s:
        assert_fact(s, FactInput(subject_id=ada, predicate="note", text="Ada Lovelace met Babbage.",
                                 value="met", scopes=("exec",)))
        third = refresh(s)
        embed = s.execute(select(Profile.embed_state).where(Profile.id == exec_[0].id)).scalar_one()
        kept, kept_state = s.execute(select(Profile.summary, Profile.embed_state)
                                     .where(Profile.id == team[0].id)).one()
    assert (third.inserted, third.updated, third.unchanged) == (0, 1, 1)
    assert embed == "pending"  # the changed profile goes back on the embedding queue
    assert kept == team[0].summary and kept_state == "ready"  # the unchanged one is untouched
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert refresh(s).inserted == 0
        assert s.execute(select(Profile)).scalars().all() == []
