"""RAPTOR: recursive cluster summaries per scope set; lineage, incremental updates, crashes, scopes."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, event, func, select, text, update

from orchestrator.audit.lineage import lineage
from orchestrator.auth import Identity
from orchestrator.config import Settings
from orchestrator.db.engine import make_app_engine
from orchestrator.db.knowledge_models import FactContent, RaptorNode
from orchestrator.db.models import Chunk, Document
from orchestrator.db.session import bound_session
from orchestrator.derive.raptor import SENTENCES, build, config, split
from orchestrator.derive.summarize import METHOD
from orchestrator.errors import BadInput
from orchestrator.ingest.documents import DocumentInput, delete_document
from orchestrator.ingest.knowledge import FactInput, assert_fact, resolve_entity
from orchestrator.worker.queue import EMBEDDABLE, QueueWorker
from tests.conftest import TenantFixture, TestDatabase
from tests.support.derive import cli_env
from tests.support.recall import doc, embedder, write_documents

__all__ = ["cli_env", "embedder"]

Tenants = Callable[..., TenantFixture]
NODES = "memory.raptor_nodes"

TOPICS = {
    "sky": ["The telescope observed a distant spiral galaxy through the night.",
            "Astronomers measured the orbit of a comet as it neared the sun.",
            "A glowing nebula of gas and dust is where new stars are born.",
            "Jupiter has dozens of moons and a great red storm in its clouds."],
    "kitchen": ["Knead the bread dough and let it rise before baking it in the oven.",
                "Simmer the tomato sauce with garlic, basil and olive oil.",
                "Whisk the eggs with sugar to bake a light sponge cake.",
                "Roast the vegetables in a hot oven until golden and crisp."],
    "sea": ["The sailors trimmed the mainsail as the wind shifted to the north.",
            "Tie a bowline knot to secure the sailing boat to the dock.",
            "The yacht tacked upwind across the harbour under full sail.",
            "Check the tide tables before sailing the dinghy out of the bay."],
}


def _small(settings: Settings, **kw: Any) -> Settings:
    return settings.model_copy(update={"raptor_cluster_size": 3, "raptor_max_cluster_size": 5,
                                       "raptor_join_distance": 0.75, **kw})


def _corpus(scopes: tuple[str, ...] = ("team",), topics: dict[str, list[str]] = TOPICS,
            prefix: str = "") -> list[DocumentInput]:
    return [doc(f"{prefix}{topic}-{i}.md", f"{topic} {i}", body, scopes=scopes)
            for topic, bodies in topics.items() for i, body in enumerate(bodies)]


def _nodes(engine: Engine, ident: Identity) -> dict[uuid.UUID, RaptorNode]:
    with bound_session(engine, ident) as s:
        return {n.id: n for n in s.execute(select(RaptorNode)).scalars()}


def _chunks(engine: Engine, ident: Identity) -> dict[uuid.UUID, tuple[str, str, Any]]:
    with bound_session(engine, ident) as s:
        rows = s.execute(select(Chunk.id, Document.path, Chunk.text, Chunk.embedding)
                         .join(Document, Document.id == Chunk.document_id)
                         .where(Document.archived_at.is_(None))).all()
    return {cid: (path, text_, vec) for cid, path, text_, vec in rows}


def _ancestors(nodes: dict[uuid.UUID, RaptorNode], node_id: uuid.UUID) -> list[uuid.UUID]:
    out = []
    parent = nodes[node_id].parent_id
    while parent is not None:
        out.append(parent)
        parent = nodes[parent].parent_id
    return out


def _leaf_of(nodes: dict[uuid.UUID, RaptorNode], chunk: uuid.UUID) -> uuid.UUID:
    (leaf,) = [n.id for n in nodes.values() if chunk in n.member_chunk_ids]
    return leaf


def _check_tree(nodes: dict[uuid.UUID, RaptorNode], chunks: dict[uuid.UUID, tuple[str, str, Any]],
                facts: dict[uuid.UUID, Any] | None = None) -> None:
    """The tree's invariants: every item in exactly one leaf, one root, consistent links and centroids."""
    facts = facts or {}
    leaves = [n for n in nodes.values() if n.level == 0]
    members = Counter(c for n in leaves for c in n.member_chunk_ids)
    assert set(members) == set(chunks) and set(members.values()) == {1}
    fact_members = Counter(f for n in leaves for f in n.member_fact_ids)
    assert set(fact_members) == set(facts) and set(fact_members.values()) <= {1}
    roots = [n for n in nodes.values() if n.parent_id is None]
    assert len(roots) == 1
    for n in nodes.values():
        kids = [k for k in nodes.values() if k.parent_id == n.id]
        assert sorted(n.children) == sorted(k.id for k in kids)
        assert all(k.level == n.level - 1 for k in kids)
        if n.level == 0:
            assert not n.children and (n.member_chunk_ids or n.member_fact_ids)
            vectors = [chunks[c][2] for c in n.member_chunk_ids] + [facts[f] for f in n.member_fact_ids]
            expected = np.mean(np.stack(vectors), axis=0)
        else:
            assert kids and not n.member_chunk_ids and not n.member_fact_ids
            expected = np.mean(np.stack([k.centroid for k in kids]), axis=0)
        assert np.allclose(n.centroid, expected, atol=1e-5)
        assert n.summary and n.summary_method == METHOD + SENTENCES and n.summary_model is None


def _edges(admin_engine: Engine, tenant: uuid.UUID) -> Counter[tuple[str, str, str]]:
    """Every recorded derivation of a node, counted (a node made again records its edges again)."""
    with admin_engine.connect() as conn:
        rows = conn.execute(text(
            "select derived_row_id->>'id', source_table, source_row_id->>'id' from provenance.derivations "
            "where tenant_id = :t and derived_table = 'memory.raptor_nodes'"), {"t": tenant}).all()
    return Counter((r[0], r[1], r[2]) for r in rows)


def _derivations(admin_engine: Engine, tenant: uuid.UUID) -> set[tuple[str, str, str]]:
    return set(_edges(admin_engine, tenant))


def _inputs(node: RaptorNode) -> set[tuple[str, str, str]]:
    return ({(str(node.id), "sources.chunks", str(c)) for c in node.member_chunk_ids}
            | {(str(node.id), "knowledge.fact_content", str(f)) for f in node.member_fact_ids}
            | {(str(node.id), NODES, str(k)) for k in node.children})


def _embed_queue(test_db: TestDatabase, embedder: Any, settings: Settings, tenant: uuid.UUID,
                 tables: tuple[str, ...]) -> None:
    """What the embedding worker does: embed the tenant's pending rows of ``tables``."""
    engine = make_app_engine(test_db.database.role_url("engram_worker"), pool_size=1)
    try:
        chosen = [t for t in EMBEDDABLE if t.name in tables]
        QueueWorker(engine, embedder, settings, tables=chosen, tenants=[tenant]).drain()
    finally:
        engine.dispose()


@contextmanager
def _killed_after_first_node_write(engine: Engine) -> Iterator[None]:
    """Raise right after the first INSERT or UPDATE of memory.raptor_nodes has run."""
    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        head = " ".join(statement.split()[:3]).lower()
        if "memory.raptor_nodes" in head and head.startswith(("insert", "update")):
            raise RuntimeError("killed after the first node write")

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield
    finally:
        event.remove(engine, "after_cursor_execute", after)


@pytest.fixture
def team(tenant_factory: Tenants) -> TenantFixture:
    return tenant_factory("team", "exec")


def test_tree_with_lineage_built_once(app_engine: Engine, admin_engine: Engine, team: TenantFixture,
                                      embedder: Any, settings: Settings) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(), settings)
    cfg = _small(settings)
    with bound_session(app_engine, ident) as s:
        first = build(s, settings=cfg)
    nodes = _nodes(app_engine, ident)
    chunks = _chunks(app_engine, ident)
    assert (first.inserted, first.updated, first.deleted) == (len(nodes), 0, 0)
    assert first.scope_sets == 1 and first.levels == max(n.level for n in nodes.values()) + 1 >= 3
    _check_tree(nodes, chunks)
    assert all(n.scopes == [team.scopes["team"]] and n.embed_state == "pending" for n in nodes.values())
    assert all(len(n.member_chunk_ids) <= 5 for n in nodes.values())
    for leaf in (n for n in nodes.values() if n.level == 0):
        # an extractive summary quotes its own members and nothing else
        sentences = {s for c in leaf.member_chunk_ids for s in chunks[c][1].split(". ")}
        assert any(s.rstrip(".") in leaf.summary for s in sentences)
        others = [chunks[c][1] for c in chunks if c not in leaf.member_chunk_ids]
        assert not any(o.rstrip(".") in leaf.summary for o in others)
    # the tree clusters by meaning: every leaf holds one topic only
    for leaf in (n for n in nodes.values() if n.level == 0):
        assert len({chunks[c][0].split("-")[0] for c in leaf.member_chunk_ids}) == 1

    expected = set()
    for n in nodes.values():
        expected |= {(str(n.id), "sources.chunks", str(c)) for c in n.member_chunk_ids}
        expected |= {(str(n.id), NODES, str(k)) for k in n.children}
    assert _derivations(admin_engine, team.id) == expected
    (root,) = [n for n in nodes.values() if n.parent_id is None]
    with admin_engine.connect() as conn:
        walk = lineage(conn, team.id, NODES, {"id": str(root.id)}, direction="back")
        kinds = set(conn.execute(text(
            "select a.kind from provenance.derivations d join provenance.activities a "
            "on a.tenant_id = d.tenant_id and a.id = d.activity_id "
            "where d.tenant_id = :t and d.derived_table = 'memory.raptor_nodes'"), {"t": team.id}).scalars())
    assert walk.proven()
    assert {key for key in walk.nodes if key[0] == "sources.chunks"} == {
        ("sources.chunks", f'{{"id":"{c}"}}') for c in chunks}
    assert kinds == {"derive.raptor"}

    with bound_session(app_engine, ident) as s:
        again = build(s, settings=cfg)
    assert (again.inserted, again.updated, again.deleted, again.resummarised) == (0, 0, 0, 0)
    assert again.unchanged == len(nodes) and again.changed_ids == []
    after = _nodes(app_engine, ident)
    assert {k: (v.updated_at, v.summary) for k, v in after.items()} == {
        k: (v.updated_at, v.summary) for k, v in nodes.items()}
    assert _derivations(admin_engine, team.id) == expected


def test_new_document_touches_its_leaf_and_ancestors_only(
        app_engine: Engine, admin_engine: Engine, team: TenantFixture, embedder: Any, settings: Settings,
        test_db: TestDatabase) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(), settings)
    cfg = _small(settings)
    with bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    _embed_queue(test_db, embedder, settings, team.id, (NODES,))  # the worker embeds every node
    before = _nodes(app_engine, ident)
    edges_before = _edges(admin_engine, team.id)
    assert {n.embed_state for n in before.values()} == {"ready"}

    write_documents(app_engine, ident, embedder, [
        doc("kitchen-new.md", "kitchen new", "Bake the bread in a hot oven until the crust is brown.")],
        settings)
    chunks = _chunks(app_engine, ident)
    (new_chunk,) = [c for c, (path, _, _) in chunks.items() if path == "kitchen-new.md"]
    with bound_session(app_engine, ident) as s:
        report = build(s, settings=cfg)
    after = _nodes(app_engine, ident)
    _check_tree(after, chunks)
    leaf = _leaf_of(after, new_chunk)
    touched = {leaf, *_ancestors(after, leaf)}
    assert report.joined == 1 and leaf in before  # joined an existing leaf ...
    # ... of its own topic
    assert {chunks[c][0].split("-")[0] for c in after[leaf].member_chunk_ids} == {"kitchen"}
    assert (report.inserted, report.deleted) == (0, 0)
    assert set(report.changed_ids) == touched and report.updated == len(touched)
    assert 1 <= report.resummarised <= len(touched) and report.unchanged == len(before) - len(touched)
    # a node made anew (members or summary changed) records edges to all its inputs; nothing else does
    made = {n for n in touched if n == leaf or after[n].summary != before[n].summary}
    assert leaf in made
    new_edges = _edges(admin_engine, team.id) - edges_before
    assert set(new_edges) == set().union(*(_inputs(after[n]) for n in made))
    assert set(new_edges.values()) == {1}
    for nid, node in after.items():
        old = before[nid]
        if nid in touched:
            assert node.updated_at > old.updated_at
            # a changed summary goes back on the embedding queue; an unchanged one keeps its vector
            assert node.embed_state == ("pending" if node.summary != old.summary else "ready")
        else:
            assert (node.updated_at, node.summary, node.embed_state) == (old.updated_at, old.summary, "ready")
    assert after[leaf].summary != before[leaf].summary or len(after[leaf].member_chunk_ids) > 1


def test_archived_and_deleted_content_leaves_the_tree(app_engine: Engine, team: TenantFixture,
                                                      embedder: Any, settings: Settings) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(), settings)
    cfg = _small(settings)
    with bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    before = _nodes(app_engine, ident)
    old_chunks = _chunks(app_engine, ident)
    sea = {c for c, (path, _, _) in old_chunks.items() if path.startswith("sea-")}
    sea_leaves = {_leaf_of(before, c) for c in sea}
    with bound_session(app_engine, ident) as s:
        s.execute(update(Document).where(Document.path.like("sea-%")).values(archived_at=func.now()))
        delete_document(s, "notes", "sky-0.md")
    chunks = _chunks(app_engine, ident)
    with bound_session(app_engine, ident) as s:
        report = build(s, settings=cfg)
    after = _nodes(app_engine, ident)
    _check_tree(after, chunks)
    gone = set(old_chunks) - set(chunks)
    assert len(gone) == 5
    assert not any(set(n.member_chunk_ids) & gone for n in after.values())
    assert report.deleted >= len(sea_leaves) and not sea_leaves & set(after)
    assert not any(w in n.summary.lower() for n in after.values() for w in ("sail", "yacht", "tide"))
    with bound_session(app_engine, ident) as s:
        again = build(s, settings=cfg)
    assert (again.inserted, again.updated, again.deleted) == (0, 0, 0)
    # nothing left to summarise: the whole tree goes
    with bound_session(app_engine, ident) as s:
        s.execute(update(Document).values(archived_at=func.now()))
        emptied = build(s, settings=cfg)
    assert (emptied.deleted, emptied.inserted, emptied.updated) == (len(after), 0, 0)
    assert _nodes(app_engine, ident) == {}


def test_full_rebuild_replaces_the_tree(app_engine: Engine, team: TenantFixture, embedder: Any,
                                        settings: Settings) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(), settings)
    cfg = _small(settings)
    with bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    before = _nodes(app_engine, ident)
    with bound_session(app_engine, ident) as s:
        full = build(s, full=True, settings=cfg)
    after = _nodes(app_engine, ident)
    assert full.deleted == len(before) and full.inserted == len(after) and full.updated == 0
    assert not set(before) & set(after)
    _check_tree(after, _chunks(app_engine, ident))
    # the same input clusters the same way
    assert sorted(sorted(n.member_chunk_ids) for n in after.values() if n.level == 0) == sorted(
        sorted(n.member_chunk_ids) for n in before.values() if n.level == 0)
    with bound_session(app_engine, ident) as s:
        again = build(s, settings=cfg)
    assert (again.inserted, again.updated, again.deleted, again.unchanged) == (0, 0, 0, len(after))


def test_a_leaf_is_summarised_from_its_prose_and_an_older_tree_once_again(
        app_engine: Engine, admin_engine: Engine, team: TenantFixture, embedder: Any,
        settings: Settings) -> None:
    """npm's docs: leaves were summarised from every sentence of their chunks, so summaries
    read "```bash npm access list packages <org:team> ```." and "* [npm access](...) *
    [npm config](...)". A leaf's sentences are its prose now (``quality.plausible_statement``);
    a tree summarised before (its nodes' method without ``SENTENCES``) is summarised again
    once, and then left alone."""
    ident = team.identity(write=("team",))
    code = "```bash\nnpm access list packages <org:team>\n```"
    table = "| Flag | Default | Type |\n| --- | --- | --- |\n| `--file` | null | String |"
    links = "* [npm access](/commands/npm-access)\n* [npm config](/commands/npm-config)"
    topics = {k: [f"{body}\n\n{code}\n\n{table}\n\n{links}" for body in v] for k, v in TOPICS.items()}
    write_documents(app_engine, ident, embedder, _corpus(topics=topics), settings)
    cfg = _small(settings, raptor_summary_sentences=6)
    with bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    nodes = _nodes(app_engine, ident)
    said = " ".join(n.summary for n in nodes.values())
    assert nodes and not any(x in said for x in ("```", "| Flag", "[npm access]", "(/commands")), said
    assert any(sentence in said for v in TOPICS.values() for sentence in v), said
    # A tree summarised under the rule before: every node is summarised again, once.
    with admin_engine.begin() as conn:
        conn.execute(text(f"update {NODES} set summary_method = :m where tenant_id = :t"),
                     {"m": METHOD, "t": team.id})
    with bound_session(app_engine, ident) as s:
        again = build(s, settings=cfg)
    assert again.resummarised == len(nodes) and again.updated == len(nodes), again
    assert {n.summary_method for n in _nodes(app_engine, ident).values()} == {METHOD + SENTENCES}
    with bound_session(app_engine, ident) as s:
        third = build(s, settings=cfg)
    assert (third.resummarised, third.updated, third.unchanged) == (0, 0, len(nodes)), third


def test_a_parent_is_summarised_from_its_childrens_prose(settings: Settings) -> None:
    """A leaf of property lines alone (``/etc/passwd`` in a notes folder) is summarised by
    them (a group of code still gets a summary); its parent read them among its other
    children's prose. A parent's sentences are its children's prose where any has some."""
    from orchestrator.derive.raptor import _Node, _sentences, _Tree, config

    passwd = ("root:x:0:0:root:/root:/bin/bash daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin "
              "bin:x:2:2:bin:/bin:/usr/sbin/nologin")
    prose = "The meeting with Zoe covers the cafe budget. The espresso costs two euros."
    parent = _Node(level=1)
    data, words = _Node(level=0, parent=parent, summary=passwd), _Node(level=0, parent=parent,
                                                                        summary=prose)
    tree = _Tree(key=(), nodes=[parent, data, words], gone=[], kids={id(parent): [data, words]})
    cfg = config(settings)
    assert _sentences(tree, parent, {}, cfg) == ["The meeting with Zoe covers the cafe budget.",
                                                 "The espresso costs two euros."]
    lonely = _Node(level=1)
    alone = _Tree(key=(), nodes=[lonely, data], gone=[], kids={id(lonely): [data]})
    assert " ".join(_sentences(alone, lonely, {}, cfg)) == passwd  # none is prose: all of them


def test_a_leaf_is_summarised_from_the_text_a_reader_sees(
        app_engine: Engine, team: TenantFixture, embedder: Any, settings: Settings) -> None:
    """Node.js's API reference keeps each method's change history in an HTML comment, which a
    reader never sees; cut into sentences with the comment in, a summary read "<!-- YAML
    added: v0.5.8 changes: - version: v5.0.0 pr-url: https://github.com/... description: A
    truncated input stream will now result in an 'error' event." The comment goes first, and
    the link reference definitions a page keeps at its end ("[`fs.stat()`]: fs.md#...")."""
    ident = team.identity(write=("team",))
    history = ("<!-- YAML\nadded: v0.5.8\nchanges:\n  - version: v5.0.0\n    pr-url: "
               "https://github.com/nodejs/node/pull/2595\n    description: A truncated input "
               "stream will now result in an error event and the caller is told.\n-->")
    links = "[`fs.stat()`]: fs.md#fsstatpath-options-callback\n[Readable]: #class-streamreadable"
    topics = {k: [f"{history}\n\n{body}\n\n{links}" for body in v] for k, v in TOPICS.items()}
    write_documents(app_engine, ident, embedder, _corpus(topics=topics), settings)
    with bound_session(app_engine, ident) as s:
        build(s, settings=_small(settings, raptor_summary_sentences=6))
    said = " ".join(n.summary for n in _nodes(app_engine, ident).values())
    assert said and not any(x in said for x in ("<!--", "YAML", "pr-url", "truncated", "fs.md#",
                                                  "[Readable]")), said
    assert any(sentence in said for v in TOPICS.values() for sentence in v), said


def test_a_summary_reads_as_prose_not_markdown(
        app_engine: Engine, team: TenantFixture, embedder: Any, settings: Settings) -> None:
    """undici's API reference: summaries read "#### Example - Client connect event. * **upstream**
    `string` - It should only include the **protocol, hostname, and port**." A heading labels
    a section and is no sentence; a list item's marker, emphasis and a link's target are
    markup a reader never sees."""
    ident = team.identity(write=("team",))

    def marked(body: str) -> str:
        first, rest = body.split(" ", 1)
        return (f"#### Example - Harbour Lights Overview\n\n* **{first}** {rest}\n"
                f"- [x] See [the notes](notes.md#harbour) for *more* on this.")

    topics = {k: [marked(body) for body in v] for k, v in TOPICS.items()}
    write_documents(app_engine, ident, embedder, _corpus(topics=topics), settings)
    with bound_session(app_engine, ident) as s:
        build(s, settings=_small(settings, raptor_summary_sentences=6))
    said = " ".join(n.summary for n in _nodes(app_engine, ident).values())
    assert said and not any(x in said for x in ("#", "**", "* ", "](", "[x]", "Harbour Lights")), said
    # The items' prose, as a reader sees it.
    assert any(sentence in said for v in TOPICS.values() for sentence in v), said


def test_killed_run_rolls_back_and_the_restart_completes(app_engine: Engine, admin_engine: Engine,
                                                         team: TenantFixture, embedder: Any,
                                                         settings: Settings) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(), settings)
    cfg = _small(settings)
    with _killed_after_first_node_write(app_engine), pytest.raises(RuntimeError, match="killed"), \
            bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    assert _nodes(app_engine, ident) == {} and _derivations(admin_engine, team.id) == set()
    with bound_session(app_engine, ident) as s:
        first = build(s, settings=cfg)
    built = _nodes(app_engine, ident)
    assert first.inserted == len(built)
    _check_tree(built, _chunks(app_engine, ident))

    # killed during an incremental update: the committed tree stays as it was
    write_documents(app_engine, ident, embedder, [
        doc("sky-new.md", "sky new", "The astronomers pointed the telescope at a faint galaxy.")], settings)
    with _killed_after_first_node_write(app_engine), pytest.raises(RuntimeError, match="killed"), \
            bound_session(app_engine, ident) as s:
        build(s, settings=cfg)
    assert {k: v.updated_at for k, v in _nodes(app_engine, ident).items()} == {
        k: v.updated_at for k, v in built.items()}
    with bound_session(app_engine, ident) as s:
        resumed = build(s, settings=cfg)
    assert resumed.updated + resumed.inserted >= 1
    _check_tree(_nodes(app_engine, ident), _chunks(app_engine, ident))
    with bound_session(app_engine, ident) as s:
        again = build(s, settings=cfg)
    assert (again.inserted, again.updated, again.deleted) == (0, 0, 0)


def test_trees_are_per_scope_set(app_engine: Engine, team: TenantFixture, embedder: Any,
                                 settings: Settings, tenant_factory: Tenants) -> None:
    cfg = _small(settings)
    alice = team.identity("alice", write=("team",))
    bob = team.identity("bob", write=("exec",))
    write_documents(app_engine, alice, embedder, _corpus(topics={"kitchen": TOPICS["kitchen"]}), settings)
    secret = {"merger": ["The board secretly plans a merger with a rival firm.",
                         "The merger talks stay confidential until the spring.",
                         "Lawyers drafted the secret merger agreement overnight."]}
    write_documents(app_engine, bob, embedder, _corpus(("exec",), secret), settings)
    write_documents(app_engine, team.identity("carol", write=("team", "exec")), embedder,
                    _corpus(("team", "exec"), {"shared": ["The offsite is on Friday for everyone."]}),
                    settings)

    with bound_session(app_engine, team.identity("alice", write=("team",), read=("exec",))) as s:
        partial = build(s, settings=cfg)
    assert partial.scope_sets == 1  # alice may write only the team scope set
    with bound_session(app_engine, team.identity("dana", write=("team", "exec"))) as s:
        full = build(s, settings=cfg)
    assert full.scope_sets == 3 and full.unchanged == partial.inserted

    team_reader = team.identity("erin", read=("team",))
    exec_reader = team.identity("frank", read=("exec",))
    seen_by_team = _nodes(app_engine, team_reader)
    seen_by_exec = _nodes(app_engine, exec_reader)
    team_id, exec_id = team.scopes["team"], team.scopes["exec"]
    both = tuple(sorted((team_id, exec_id)))
    assert {tuple(sorted(n.scopes)) for n in seen_by_team.values()} == {(team_id,), both}
    assert {tuple(sorted(n.scopes)) for n in seen_by_exec.values()} == {(exec_id,), both}
    assert not any("merger" in n.summary for n in seen_by_team.values())
    assert any("merger" in n.summary for n in seen_by_exec.values())
    assert not any("oven" in n.summary or "sauce" in n.summary for n in seen_by_exec.values())
    # every node summarises only chunks its readers may read
    for reader, seen in ((team_reader, seen_by_team), (exec_reader, seen_by_exec)):
        readable = set(_chunks(app_engine, reader))
        assert {c for n in seen.values() for c in n.member_chunk_ids} == readable
    other = tenant_factory("team")
    with bound_session(app_engine, other.identity(write=("team",))) as s:
        nothing = build(s, settings=cfg)
    assert (nothing.scope_sets, nothing.inserted) == (0, 0)


def test_world_facts_join_the_tree(app_engine: Engine, admin_engine: Engine, team: TenantFixture,
                                   embedder: Any, settings: Settings, test_db: TestDatabase) -> None:
    ident = team.identity(write=("team",))
    write_documents(app_engine, ident, embedder, _corpus(topics={"sky": TOPICS["sky"]}), settings)
    with bound_session(app_engine, ident) as s:
        comet = resolve_entity(s, "thing", "Halley's Comet", ("team",))
        assert comet is not None

        def fact(text_: str, **kw: Any) -> uuid.UUID:
            claim = assert_fact(s, FactInput(subject_id=comet, predicate="note", text=text_, value=text_[:50],
                                             scopes=("team",), **kw)).claim_id
            assert claim is not None
            content: uuid.UUID = s.execute(text("select content_id from knowledge.fact_claim where id = :c"),
                                           {"c": claim}).scalar_one()
            return content

        world = fact("Halley's Comet returns to the inner solar system every 76 years.")
        opinion = fact("Halley's Comet is the most beautiful comet.", kind="opinion")
        extracted = fact("Halley's Comet was mentioned in a chunk.", author_role="extractor")
    _embed_queue(test_db, embedder, settings, team.id, ("knowledge.fact_content",))
    with bound_session(app_engine, ident) as s:
        build(s, settings=_small(settings))
        vectors = dict(s.execute(select(FactContent.id, FactContent.embedding)).all())
    nodes = _nodes(app_engine, ident)
    _check_tree(nodes, _chunks(app_engine, ident), {world: vectors[world]})
    members = {f for n in nodes.values() for f in n.member_fact_ids}
    assert world in members and opinion not in members and extracted not in members
    leaf = next(n for n in nodes.values() if world in n.member_fact_ids)
    assert (str(leaf.id), "knowledge.fact_content", str(world)) in _derivations(admin_engine, team.id)


def test_bad_settings_are_refused(app_engine: Engine, team: TenantFixture, settings: Settings) -> None:
    for change, named in [({"raptor_cluster_size": 1}, "raptor_cluster_size"),
                          ({"raptor_cluster_size": 10, "raptor_max_cluster_size": 5},
                           "raptor_max_cluster_size"),
                          ({"raptor_join_distance": 2.5}, "raptor_join_distance"),
                          ({"raptor_max_levels": 0}, "raptor_max_levels"),
                          ({"raptor_summary_chars": 20_001}, "raptor_summary_chars")]:
        with pytest.raises(BadInput, match=named) as refused:
            config(settings.model_copy(update=change))
        assert "must be between" in str(refused.value)
        with pytest.raises(BadInput, match=named), \
                bound_session(app_engine, team.identity(write=("team",))) as s:
            build(s, settings=settings.model_copy(update=change))
    url_only = settings.model_copy(update={"summary_endpoint_url": "http://127.0.0.1:9/v1"})
    with pytest.raises(BadInput, match="summary_endpoint_model"), \
            bound_session(app_engine, team.identity(write=("team",))) as s:
        build(s, settings=url_only)
    with bound_session(app_engine, team.identity(read=("team",))) as s:
        assert s.execute(select(func.count()).select_from(RaptorNode)).scalar_one() == 0


def test_split_is_deterministic_and_bounded() -> None:
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(20, 16))
    vectors = centers[rng.integers(0, 20, 500)] + 0.3 * rng.normal(size=(500, 16))
    groups = split(vectors, 8, 16, 42)
    assert sorted(i for g in groups for i in g) == list(range(500))
    assert max(len(g) for g in groups) <= 16 and 20 <= len(groups) <= 500 // 2
    assert split(vectors, 8, 16, 42) == groups
    assert split(np.ones((40, 16)), 8, 16, 42) == [list(range(i, i + 8)) for i in range(0, 40, 8)]
    assert split(vectors[:5], 8, 16, 42) == [[0, 1, 2, 3, 4]]


def test_cli_raptor(app_engine: Engine, team: TenantFixture, embedder: Any, settings: Settings,
                    cli_env: dict[str, str]) -> None:
    from typer.testing import CliRunner

    from orchestrator.cli.main import app

    write_documents(app_engine, team.identity(write=("team",)), embedder, _corpus(), settings)
    who = ["--tenant", team.org_id, "--scopes", "write:team"]
    first = CliRunner().invoke(app, ["derive", "raptor", *who], env=cli_env)
    assert first.exit_code == 0, first.output
    assert "1 scope sets:" in first.output and "0 updated, 0 deleted, 0 unchanged" in first.output
    again = CliRunner().invoke(app, ["derive", "raptor", *who], env=cli_env)
    assert again.exit_code == 0, again.output
    assert "0 inserted, 0 updated, 0 deleted" in again.output
    full = CliRunner().invoke(app, ["derive", "raptor", "--full", *who], env=cli_env)
    assert full.exit_code == 0, full.output
    assert "0 updated" in full.output and "0 deleted" not in full.output
    bad = CliRunner().invoke(app, ["derive", "raptor", *who],
                             env={**cli_env, "ENGRAM_RAPTOR_CLUSTER_SIZE": "1"})
    assert bad.exit_code == 2 and "raptor_cluster_size" in bad.output
