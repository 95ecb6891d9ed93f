"""Consolidation: observations from corroborating claims, per scope set and perspective partition."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, text

from orchestrator.db.knowledge_models import Observation
from orchestrator.db.session import bound_session
from orchestrator.derive.consolidate import consolidate, noisy_or
from orchestrator.errors import BadInput
from orchestrator.ingest.knowledge import EpistemicKind, FactInput, assert_fact, resolve_entity
from tests.conftest import TenantFixture
from tests.support.derive import cli_env  # noqa: F401

Tenants = Callable[..., TenantFixture]
Corpus = tuple[TenantFixture, uuid.UUID, dict[str, uuid.UUID]]


def _claim(app_engine: Engine, t: TenantFixture, user: str, subject: uuid.UUID, value: str, text_: str,
           scopes: tuple[str, ...] = ("team",), *, kind: EpistemicKind = "world_fact",
           confidence: float = 1.0, predicate: str = "works_at") -> uuid.UUID:
    with bound_session(app_engine, t.identity(user, write=scopes)) as s:
        claim = assert_fact(s, FactInput(subject_id=subject, predicate=predicate, text=text_, value=value,
                                         scopes=scopes, kind=kind, confidence=confidence)).claim_id
    assert claim is not None
    return claim


def _counts(admin_engine: Engine, t: TenantFixture) -> tuple[int, int, int]:
    with admin_engine.connect() as conn:
        found = tuple(int(conn.execute(text(sql), {"t": t.id}).scalar_one()) for sql in (
            "select count(*) from memory.observations where tenant_id = :t",
            "select count(*) from provenance.events where tenant_id = :t",
            "select count(*) from provenance.derivations where tenant_id = :t"))
    return found  # type: ignore[return-value]


@pytest.fixture
def corpus(app_engine: Engine, tenant_factory: Tenants) -> Corpus:
    t = tenant_factory("team", "exec")
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        ada = resolve_entity(s, "person", "Ada Lovelace", ("team", "exec"))
    assert ada is not None
    claims = {
        # one world fact from three sources: alice (twice, same text = one source), bob, carol
        "alice": _claim(app_engine, t, "alice", ada, "Acme", "Ada works at Acme.", confidence=0.9),
        "alice_again": _claim(app_engine, t, "alice", ada, "Acme", "Ada works at Acme.", confidence=0.5),
        "bob": _claim(app_engine, t, "bob", ada, "Acme", "Ada Lovelace is employed by Acme.", confidence=0.5),
        # a lone claim corroborates nothing
        "lone": _claim(app_engine, t, "bob", ada, "Initech", "Ada once consulted for Initech."),
        # the same statement in exec only: its own scope set, one source there
        "exec": _claim(app_engine, t, "carol", ada, "Acme", "Ada works at Acme (exec notes).", ("exec",)),
        # opinions live in their author's partition: alice twice (two texts), bob once
        "op1": _claim(app_engine, t, "alice", ada, "brilliant", "Ada is brilliant.", kind="opinion",
                      confidence=0.6, predicate="seems"),
        "op2": _claim(app_engine, t, "alice", ada, "brilliant", "I think Ada is brilliant.", kind="opinion",
                      confidence=0.5, predicate="seems"),
        "op_bob": _claim(app_engine, t, "bob", ada, "brilliant", "Ada seems brilliant.", kind="opinion",
                         predicate="seems"),
    }
    return t, ada, claims


def test_observations_with_confidence_partitions_and_lineage(
        app_engine: Engine, admin_engine: Engine, corpus: Corpus) -> None:
    t, ada, c = corpus
    with bound_session(app_engine, t.identity("dana", write=("team", "exec"))) as s:
        report = consolidate(s)
        rows = {o.perspective_key: o for o in s.execute(select(Observation)).scalars()}
        recallable = s.execute(text("select perspective_key from memory.recallable_observations")
                               ).scalars().all()
    assert (report.inserted, report.updated, report.deleted, report.unchanged) == (2, 0, 0, 0)
    assert set(rows) == {"world", "user:alice"}  # bob's lone opinion and every single claim: none
    world = rows["world"]
    assert world.subject_entity_id == ada and world.scopes == [t.scopes["team"]]
    assert set(world.source_claim_ids) == {c["alice"], c["alice_again"], c["bob"]}
    # sources: (alice, that text) at max(0.9, 0.5) and (bob, his text) at 0.5
    assert world.confidence == pytest.approx(noisy_or([0.9, 0.5])) == pytest.approx(0.95)
    assert world.observation_key.startswith("obs:") and world.summary_method.startswith("extractive:")
    assert "Acme" in world.text
    mine = rows["user:alice"]
    assert set(mine.source_claim_ids) == {c["op1"], c["op2"]}
    assert mine.confidence == pytest.approx(0.8)
    assert sorted(recallable) == ["user:alice", "world"]  # both >= 0.65
    with admin_engine.connect() as conn:
        edges = conn.execute(text(
            "select derived_row_id ->> 'id', source_table, source_row_id ->> 'id' "
            "from provenance.derivations where tenant_id = :t and derived_table = 'memory.observations'"),
            {"t": t.id}).all()
        activities = conn.execute(text(
            "select count(*) from provenance.activities where tenant_id = :t "
            "and kind = 'derive.consolidate'"),
            {"t": t.id}).scalar_one()
    assert {(uuid.UUID(d), s_, uuid.UUID(src)) for d, s_, src in edges} == {
        (world.id, "knowledge.fact_claim", x) for x in (c["alice"], c["alice_again"], c["bob"])} | {
        (mine.id, "knowledge.fact_claim", x) for x in (c["op1"], c["op2"])}
    assert activities == 1


def test_weak_evidence_is_stored_but_not_recallable(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        ada = resolve_entity(s, "person", "Ada", ("team",))
    assert ada is not None
    for who in ("ann", "ben"):
        _claim(app_engine, t, who, ada, "London", f"{who} says Ada lives in London.", confidence=0.3,
               predicate="lives_in")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        assert consolidate(s).recallable == 0
        stored = s.execute(select(Observation.confidence)).scalars().all()
        gate = s.execute(text("select count(*) from memory.recallable_observations")).scalar_one()
    assert stored == [pytest.approx(0.51)] and gate == 0
    _claim(app_engine, t, "cy", ada, "London", "Cy says Ada lives in London.", confidence=0.3,
           predicate="lives_in")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        third = consolidate(s)
        gate = s.execute(text("select count(*) from memory.recallable_observations")).scalar_one()
    assert (third.updated, third.recallable, gate) == (1, 1, 1)  # 1 - 0.7^3 = 0.657


def test_rerun_changes_nothing_then_updates_in_place_and_deletes(
        app_engine: Engine, admin_engine: Engine, corpus: Corpus) -> None:
    t, ada, c = corpus
    both = t.identity("dana", write=("team", "exec"))
    with bound_session(app_engine, both) as s:
        consolidate(s)
        first = {o.perspective_key: (o.id, o.confidence) for o in s.execute(select(Observation)).scalars()}
    before = _counts(admin_engine, t)
    with bound_session(app_engine, both) as s:
        again = consolidate(s)
    assert (again.inserted, again.updated, again.deleted, again.unchanged) == (0, 0, 0, 2)
    assert _counts(admin_engine, t) == before  # not one row, event or derivation more
    erin = _claim(app_engine, t, "erin", ada, "Acme", "Erin: Ada works at Acme.", confidence=0.5)
    with bound_session(app_engine, both) as s:
        third = consolidate(s)
        now = {o.perspective_key: o for o in s.execute(select(Observation)).scalars()}
    assert (third.inserted, third.updated, third.unchanged) == (0, 1, 1)
    assert now["world"].id == first["world"][0]  # updated in place, never duplicated
    assert erin in now["world"].source_claim_ids
    assert now["world"].confidence == pytest.approx(noisy_or([0.9, 0.5, 0.5]))
    # two sources withdrawn: the group no longer corroborates, its observation goes
    with bound_session(app_engine, t.identity("alice", write=("team",))) as s:
        s.execute(text("update knowledge.fact_claim set superseded_at = now() where id = any(:ids)"),
                  {"ids": [c["bob"], erin]})
    with bound_session(app_engine, both) as s:
        fourth = consolidate(s)
        left = s.execute(select(Observation.perspective_key)).scalars().all()
    assert (fourth.deleted, fourth.unchanged) == (1, 1) and left == ["user:alice"]


def test_outputs_respect_scopes_and_tenants(app_engine: Engine, tenant_factory: Tenants,
                                            corpus: Corpus) -> None:
    t, ada, _ = corpus
    # A second exec source: exec now has its own observation, never merged with team's.
    _claim(app_engine, t, "dave", ada, "Acme", "Dave: Ada is with Acme.", ("exec",))
    # The same statement shared into team and exec is a third scope set, with one source.
    _claim(app_engine, t, "eve", ada, "Acme", "Eve: Ada works at Acme.", ("team", "exec"))
    with bound_session(app_engine, t.identity("team-writer", write=("team",))) as s:
        assert consolidate(s).inserted == 2  # only what a team writer may write: world + alice's
    with bound_session(app_engine, t.identity("exec-writer", write=("exec",))) as s:
        assert consolidate(s).inserted == 1
    with bound_session(app_engine, t.identity("exec-reader", read=("exec",))) as s:
        seen = s.execute(select(Observation.scopes, Observation.text)).all()
    assert [scopes for scopes, _ in seen] == [[t.scopes["exec"]]]
    assert "Dave" in seen[0][1] or "exec notes" in seen[0][1]
    with bound_session(app_engine, t.identity("team-reader", read=("team",))) as s:
        team = s.execute(select(Observation.scopes, Observation.source_claim_ids)).all()
        readable = set(s.execute(text("select id from knowledge.fact_claim")).scalars())
    assert len(team) == 2 and all(scopes == [t.scopes["team"]] for scopes, _ in team)
    assert all(set(ids) <= readable for _, ids in team)  # every claim behind it is readable
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        assert consolidate(s).inserted == 0
        assert s.execute(select(Observation)).scalars().all() == []


def test_killed_mid_run_then_restarted_has_no_duplicates(
        app_engine: Engine, admin_engine: Engine, monkeypatch: pytest.MonkeyPatch,
        corpus: Corpus) -> None:
    import orchestrator.derive.consolidate as job
    from orchestrator.audit.lineage import record_derivation as real

    t, _, _ = corpus
    calls = [0]

    def crash_on_second(*args: object, **kw: object) -> object:
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt("killed")
        return real(*args, **kw)  # type: ignore[arg-type]

    before = _counts(admin_engine, t)
    monkeypatch.setattr(job, "record_derivation", crash_on_second)
    with pytest.raises(KeyboardInterrupt), bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        consolidate(s)
    assert _counts(admin_engine, t) == before
    monkeypatch.setattr(job, "record_derivation", real)
    with bound_session(app_engine, t.identity(write=("team", "exec"))) as s:
        assert consolidate(s).inserted == 2
        keys = s.execute(select(Observation.observation_key)).scalars().all()
    assert len(keys) == len(set(keys)) == 2


def test_bad_input_is_refused_and_writes_nothing(app_engine: Engine, admin_engine: Engine,
                                                 corpus: Corpus) -> None:
    t, _, _ = corpus
    before = _counts(admin_engine, t)
    for bad in (1, 0, True, "2"):
        with pytest.raises(BadInput, match="min_evidence must be an integer of at least 2"), \
                bound_session(app_engine, t.identity(write=("team",))) as s:
            consolidate(s, min_evidence=bad)  # type: ignore[arg-type]
    assert _counts(admin_engine, t) == before


def test_cli_consolidate(cli_env: dict[str, str],  # noqa: F811
                         corpus: Corpus) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    t, _, _ = corpus
    who = ["--tenant", t.org_id, "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "consolidate", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert first.output.startswith(
        "observations: 2 inserted, 0 updated, 0 deleted, 0 unchanged; 2 recallable")
    again = CliRunner().invoke(app, ["derive", "consolidate", *who], env=cli_env)
    assert "0 inserted, 0 updated, 0 deleted, 2 unchanged" in again.output
    bad = CliRunner().invoke(app, ["derive", "consolidate", "--min-evidence", "1", *who], env=cli_env)
    assert bad.exit_code == 2 and "min_evidence must be an integer of at least 2" in bad.output


def _extracted(app_engine: Engine, t: TenantFixture, bodies: dict[str, str]) -> None:
    from orchestrator.derive.extract import extract
    from orchestrator.ingest.documents import DocumentInput, put_document

    with bound_session(app_engine, t.identity("writer", write=("team",))) as s:
        for path, body in bodies.items():
            put_document(s, DocumentInput(collection="notes", path=path, title=path, body=body,
                                          scopes=("team",)))
    with bound_session(app_engine, t.identity("writer", write=("team",))) as s:
        assert extract(s).chunks == len(bodies)


def _observed(app_engine: Engine, t: TenantFixture) -> dict[str, tuple[int, float]]:
    """predicate -> (claims behind it, confidence) of every observation, as a team writer runs it."""
    with bound_session(app_engine, t.identity("dana", write=("team",))) as s:
        consolidate(s)
        rows = s.execute(text(
            "select c.predicate, cardinality(o.source_claim_ids) as n, o.confidence "
            "from memory.observations o join knowledge.fact_claim c on c.id = o.source_claim_ids[1]")).all()
    return {r.predicate: (r.n, float(r.confidence)) for r in rows}


def test_one_document_never_corroborates_itself(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    # Three sentences, one author, one document: three claims each of works_at and
    # co_mentioned_with, and a mention; counted per sentence they made 0.657 (recallable).
    _extracted(app_engine, t, {"ada.md": (
        "Ada Lovelace works at Microsoft. As everyone knows, Ada Lovelace works at Microsoft. "
        "Ada Lovelace works at Microsoft in London.")})
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        repeated = s.execute(text("select count(*) from knowledge.fact_claim where predicate = 'works_at'")
                             ).scalar_one()
    assert repeated == 3
    assert _observed(app_engine, t) == {}


def test_independent_documents_corroborate(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    _extracted(app_engine, t, {f"n{i}.md": "Ada Lovelace works at Microsoft." for i in range(3)})
    observed = _observed(app_engine, t)
    # The statement, and the co-mention, each in three documents: 1 - 0.7^3, recallable.
    # They say the same sentence, so they are one observation (the statement's). mentioned_in
    # names a different document each time: it corroborates nothing.
    assert set(observed) == {"works_at"}
    assert observed["works_at"] == (3, pytest.approx(noisy_or([0.3, 0.3, 0.3])))
    assert observed["works_at"][1] >= 0.65


def test_bookkeeping_claims_count_only_documents(app_engine: Engine, tenant_factory: Tenants) -> None:
    t = tenant_factory("team")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        ada = resolve_entity(s, "person", "Ada", ("team",))
        acme = resolve_entity(s, "organization", "Acme", ("team",))
    assert ada is not None and acme is not None
    for who in ("ann", "ben", "cy"):  # three people writing bookkeeping claims by hand
        with bound_session(app_engine, t.identity(who, write=("team",))) as s:
            assert assert_fact(s, FactInput(subject_id=ada, predicate="co_mentioned_with", object_id=acme,
                                            text=f"{who}: Ada and Acme together.", scopes=("team",))
                               ).claim_id is not None
    assert _observed(app_engine, t) == {}


def test_a_group_another_says_with_more_is_not_written() -> None:
    """Two subjects' groups shared a sentence: one observation said it alone and another
    said it with a second sentence, so recall could serve it twice (stop 36, once "Lindqvist
    Labs" was typed an organisation). The group whose sentences another group of its scopes
    and partition holds, and more, is not written; identical ones stay one, as before."""
    import uuid as uuid_

    from orchestrator.derive.consolidate import _Group, _one_per_text

    team, other = (uuid_.uuid4(),), (uuid_.uuid4(),)

    def group(scopes, subject, *texts):
        g = _Group(claims=[(uuid_.uuid4(), t) for t in texts])
        return ((scopes, "world", uuid_.uuid4(), subject, None, None, "text"), g)

    alone = "Lindqvist Labs maintains Quillstream in Oslo."
    more = "Quillstream is maintained by Maren Okafor."
    wanted = {"a": group(team, "maintains", alone), "b": group(team, "mentioned_in", alone, more),
              "c": group(other, "maintains", alone), "d": group(team, "uses", more, "Other.")}
    assert sorted(_one_per_text(wanted)) == ["b", "c", "d"]  # c: another scope set
    # (the co-mention's key sorts first, so only the rule can keep the statement)
    same = {"y": group(team, "maintains", alone), "x": group(team, "mentioned_in", alone)}
    assert list(_one_per_text(same)) == ["y"]  # a statement before a bookkeeping co-mention
