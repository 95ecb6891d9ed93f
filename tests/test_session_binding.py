"""Session binding: one identity per transaction, isolated across parallel connections."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, select, text

from orchestrator.auth import Identity
from orchestrator.db.engine import make_app_engine
from orchestrator.db.models import Document
from orchestrator.db.session import bound_session
from orchestrator.errors import Forbidden, ServerError, Unauthenticated
from orchestrator.ingest.documents import DocumentInput, put_document
from tests.conftest import TenantFixture, TestDatabase


def _doc(path: str, scopes: tuple[str, ...] = ("team",),
         body: str = "hello world") -> DocumentInput:
    return DocumentInput(collection="notes", path=path, title=path, body=body, scopes=scopes)


def test_two_identities_in_parallel_see_only_their_rows(
    app_engine: Engine, tenant_factory: Callable[..., TenantFixture]
) -> None:
    a, b = tenant_factory("team"), tenant_factory("team")
    ida, idb = a.identity(write=("team",)), b.identity(write=("team",))
    with bound_session(app_engine, ida) as s:
        put_document(s, _doc("a.md"))
    with bound_session(app_engine, idb) as s:
        put_document(s, _doc("b.md"))

    barrier = threading.Barrier(2)
    seen: dict[str, list[str]] = {}

    def read(name: str, ident: Identity) -> None:
        with bound_session(app_engine, ident) as s:
            barrier.wait(timeout=30)  # both transactions are open at the same time
            seen[name] = list(s.execute(select(Document.path)).scalars())
            barrier.wait(timeout=30)

    threads = [threading.Thread(target=read, args=("a", ida)),
               threading.Thread(target=read, args=("b", idb))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen == {"a": ["a.md"], "b": ["b.md"]}


def test_binding_ends_with_the_transaction(app_engine: Engine,
                                           tenant_factory: Callable[..., TenantFixture]) -> None:
    t = tenant_factory("team")
    with bound_session(app_engine, t.identity(write=("team",))) as s:
        put_document(s, _doc("x.md"))
    # The same pooled connection, no binding: nothing is visible.
    with app_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Document)).scalar_one() == 0
        assert conn.execute(text("select auth.tenant_id()")).scalar() is None


def test_unknown_tenant_and_scope_are_refused(app_engine: Engine,
                                              tenant_factory: Callable[..., TenantFixture]) -> None:
    t = tenant_factory("team")
    with pytest.raises(Unauthenticated, match="unknown tenant"), \
            bound_session(app_engine, Identity.of("no-such-org", "eve", read=["team"])):
        pass
    with pytest.raises(Forbidden, match="unknown scope"), \
            bound_session(app_engine, t.identity(read=("ghost",))):
        pass


def test_app_engine_refuses_a_superuser(test_db: TestDatabase) -> None:
    eng = make_app_engine(test_db.admin_url)
    try:
        with pytest.raises(ServerError, match="bypass row level security"), eng.connect():
            pass
    finally:
        eng.dispose()
