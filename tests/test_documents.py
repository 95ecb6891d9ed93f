"""Writing documents: bad input is refused with a clear message and nothing is written."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, insert, select, text

from orchestrator.db.models import Chunk, Document
from orchestrator.db.session import bound_session
from orchestrator.errors import BadInput, Conflict, Forbidden
from orchestrator.ingest.documents import DocumentInput, put_document
from tests.conftest import TenantFixture


def _doc(path: str, scopes: tuple[str, ...] = ("team",), body: str = "Some text. " * 50,
         **kw: object) -> DocumentInput:
    return DocumentInput(collection="notes", path=path, title=f"Title {path}", body=body,
                         scopes=scopes, **kw)  # type: ignore[arg-type]


def _count(app_engine: Engine, t: TenantFixture) -> tuple[int, int]:
    with bound_session(app_engine, t.identity(read=tuple(t.scopes))) as s:
        docs = s.execute(select(func.count()).select_from(Document)).scalar_one()
        chunks = s.execute(select(func.count()).select_from(Chunk)).scalar_one()
    return docs, chunks


@pytest.fixture
def tenant(tenant_factory: Callable[..., TenantFixture]) -> TenantFixture:
    return tenant_factory("team", "exec")


def test_put_chunks_and_is_idempotent(app_engine: Engine, tenant: TenantFixture) -> None:
    ident = tenant.identity(write=("team",))
    body = "\n\n".join(f"Paragraph {i}. " + "word " * 120 for i in range(6))
    with bound_session(app_engine, ident) as s:
        first = put_document(s, _doc("a.md", body=body))
    assert first.created and first.chunks >= 3
    with bound_session(app_engine, ident) as s:
        again = put_document(s, _doc("a.md", body=body))
        chunks = s.execute(select(Chunk.text, Chunk.char_start, Chunk.char_end)
                           .order_by(Chunk.ordinal)).all()
    assert not again.changed and again.chunks == 0
    for chunk_text, start, end in chunks:
        assert body[start:end] == chunk_text
    with bound_session(app_engine, ident) as s:
        edited = put_document(s, _doc("a.md", body=body + "\n\nA new ending."))
    assert edited.changed
    assert edited.chunks in (first.chunks, first.chunks + 1)


def test_line_breaks_are_stored_as_newlines(app_engine: Engine, tenant: TenantFixture) -> None:
    """A body written with Windows' \\r\\n (GraphQL, MCP or a file) is stored, hashed and
    chunked with \\n: its chunks end at sentences and carry no \\r, and the same text with
    either kind of line break is one content (no update, no new chunks)."""
    ident = tenant.identity(write=("team",))
    lines = [f"Sentence {i} of the runbook says what to check before a restart." for i in range(60)]
    windows = "# Runbook\r\n\r\n" + "\r\n".join(lines) + "\r\n\rOld Mac line.\r"
    unix = "# Runbook\n\n" + "\n".join(lines) + "\n\nOld Mac line.\n"
    with bound_session(app_engine, ident) as s:
        first = put_document(s, _doc("crlf.md", body=windows))
        body = s.execute(select(Document.body).where(Document.path == "crlf.md")).scalar_one()
        texts = s.execute(select(Chunk.text).join(Document, Document.id == Chunk.document_id)
                          .where(Document.path == "crlf.md").order_by(Chunk.ordinal)).scalars().all()
    assert first.created and first.chunks >= 2 and body == unix
    assert not any("\r" in t for t in texts)
    assert all(t.rstrip().endswith(".") for t in texts), texts  # cut at sentence ends
    for same in (unix, windows):
        with bound_session(app_engine, ident) as s:
            again = put_document(s, _doc("crlf.md", body=same))
        assert not again.changed and again.chunks == 0


def test_unknown_scope_refused(app_engine: Engine, tenant: TenantFixture) -> None:
    with pytest.raises(BadInput, match="unknown scope.*ghost"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, _doc("u.md", scopes=("team", "ghost")))
    assert _count(app_engine, tenant) == (0, 0)


def test_scope_of_another_tenant_refused(app_engine: Engine, tenant: TenantFixture,
                                         tenant_factory: Callable[..., TenantFixture]) -> None:
    other = tenant_factory("secret")
    with pytest.raises(BadInput, match="unknown scope.*secret"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, _doc("o.md", scopes=("secret",)))
    # Going around the Python check with the raw id of the other tenant's scope:
    with pytest.raises(BadInput, match="unknown scope id"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        s.execute(text(
            "insert into sources.documents (collection, path, title, body, scopes) "
            "values ('notes', 'raw.md', 'Raw', 'x', array[cast(:a as uuid), cast(:b as uuid)])"
        ), {"a": str(tenant.scopes["team"]), "b": str(other.scopes["secret"])})
    assert _count(app_engine, tenant) == (0, 0)


def test_empty_scope_set_refused(app_engine: Engine, tenant: TenantFixture) -> None:
    with pytest.raises(BadInput, match="at least one scope"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, _doc("e.md", scopes=()))
    with pytest.raises(BadInput, match="at least one scope"), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        s.execute(text("insert into sources.documents (collection, path, title, body, scopes) "
                       "values ('notes', 'e2.md', 'E', 'x', '{}')"))
    assert _count(app_engine, tenant) == (0, 0)


def test_duplicate_identity_refused(app_engine: Engine, tenant: TenantFixture) -> None:
    ident = tenant.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        put_document(s, _doc("d.md", body="original"))
    with pytest.raises(Conflict, match="duplicate key"), bound_session(app_engine, ident) as s:
        s.execute(insert(Document).values(collection="notes", path="d.md", title="Dup",
                                          body="other", scopes=[tenant.scopes["team"]]))
    with bound_session(app_engine, tenant.identity(read=("team",))) as s:
        bodies = list(s.execute(select(Document.body)).scalars())
    assert bodies == ["original"]


def test_two_writers_of_a_new_path_at_once_write_one_document(
        app_engine: Engine, tenant: TenantFixture) -> None:
    """Two ``engram ingest`` runs of one folder at once failed 41 and 44 of its 112 pages on
    "duplicate key": both saw no document at a path and inserted. The second writer now
    waits for the first's transaction, then finds its document: the same text is left
    unchanged, another text updates it."""
    import threading

    ident = tenant.identity(write=("team",))
    results: dict[str, object] = {}

    def second(body: str) -> None:
        try:
            with bound_session(app_engine, ident) as s:
                results[body] = put_document(s, _doc("race.md", body=body))
        except Exception as exc:  # reported by the assertion below
            results[body] = exc

    for body in ("Same text. " * 30, "Other text. " * 30):
        first_body = "Same text. " * 30
        results.clear()
        with bound_session(app_engine, ident) as s:
            s.execute(text("delete from sources.documents where path = 'race.md'"))
        with bound_session(app_engine, ident) as s:
            first = put_document(s, _doc("race.md", body=first_body))
            waiter = threading.Thread(target=second, args=(body,))
            waiter.start()
            waiter.join(timeout=1.0)
            assert waiter.is_alive(), "the second writer did not wait for the first"
        waiter.join(timeout=30)
        got = results[body]
        assert first.created and not isinstance(got, Exception), got
        assert got.created is False and got.changed is (body != first_body)  # type: ignore[attr-defined]
        with bound_session(app_engine, tenant.identity(read=("team",))) as s:
            assert list(s.execute(select(Document.body).where(Document.path == "race.md"))
                        .scalars()) == [body]


def test_write_without_write_scope_is_forbidden(app_engine: Engine, tenant: TenantFixture) -> None:
    with bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, _doc("shared.md", scopes=("team",), body="team text"))
    # Read-only on team: an edit is refused with 42501 and changes nothing.
    with pytest.raises(Forbidden) as err, \
            bound_session(app_engine, tenant.identity(read=("team",), write=("exec",))) as s:
        put_document(s, _doc("fresh.md", scopes=("team",)))
    assert err.value.sqlstate == "42501"
    # Write on only one of two scopes.
    with pytest.raises(Forbidden), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, _doc("both.md", scopes=("team", "exec")))
    assert _count(app_engine, tenant)[0] == 1


@pytest.mark.parametrize(("field", "value", "message"), [
    ("title", "", "title must not be empty"),
    ("body", "", "body must not be empty"),
    ("title", "t" * 600, "title is 600 characters"),
    ("state", "Sleeping", "state 'Sleeping' is not one of"),
    ("body", "nul\x00byte", "NUL character"),
    ("path", 42, "path must be text"),
    # The key as sources.documents' checks hold it, said by name ("a value breaks the rule
    # 'path length' of documents" before); one line; inside its collection.
    ("path", "p" * 1001, r"path must be 1 to 1,000 characters \(got 1,001\)"),
    ("collection", "c" * 201, r"collection must be 1 to 200 characters \(got 201\)"),
    ("path", "roof\nshared in: exec.md", r"path contains a control character \(U\+000A\)"),
    ("collection", "notes\x1b[2J", r"collection contains a control character \(U\+001B\)"),
    ("path", "../../etc/passwd", "has a '..' segment: a path names a document inside its collection"),
    ("path", "a\\..\\b.md", "has a '..' segment"),
])
def test_malformed_documents_refused(app_engine: Engine, tenant: TenantFixture, field: str,
                                     value: object, message: str) -> None:
    fields: dict[str, object] = {"collection": "notes", "path": "m.md", "title": "M",
                                 "body": "text", "scopes": ("team",)}
    fields[field] = value
    with pytest.raises(BadInput, match=message), \
            bound_session(app_engine, tenant.identity(write=("team",))) as s:
        put_document(s, DocumentInput(**fields))  # type: ignore[arg-type]
    assert _count(app_engine, tenant) == (0, 0)
