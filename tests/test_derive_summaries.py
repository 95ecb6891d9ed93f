"""Summaries record their method and model: extractive by default, abstractive through an endpoint.

The abstractive path is tested against a real HTTP server on a free local port
that speaks the OpenAI chat-completions JSON (``tests/support/chat_endpoint.py``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, select

from orchestrator.config import Settings
from orchestrator.db.knowledge_models import Community, Profile, RaptorNode
from orchestrator.db.server import free_port
from orchestrator.db.session import bound_session
from orchestrator.derive import communities, profiles, raptor
from orchestrator.derive.summarize import (
    ABSTRACTIVE_METHOD,
    MAX_FAILURES,
    METHOD,
    EndpointSummarizer,
    ExtractiveSummarizer,
    get_summarizer,
    summarize,
)
from orchestrator.errors import BadInput
from orchestrator.ingest.knowledge import FactInput, assert_fact, assert_relation, resolve_entity
from tests.conftest import TenantFixture
from tests.support.chat_endpoint import PREFIX, chat_endpoint
from tests.support.recall import doc, embedder, write_documents

__all__ = ["embedder"]

Tenants = Callable[..., TenantFixture]
SENTENCES = ["The engine computes numbers.", "Ada wrote notes on the engine.",
             "Babbage built a difference engine.", "Tea is served at four."]


def _endpoint(settings: Settings, url: str, **kw: Any) -> Settings:
    return settings.model_copy(update={
        "summary_endpoint_url": url, "summary_endpoint_model": "tiny-llm",
        "summary_endpoint_api_key": "sk-test", "summary_endpoint_timeout_s": 5.0, **kw})


def test_extractive_is_the_default() -> None:
    summarizer = get_summarizer(Settings())
    assert isinstance(summarizer, ExtractiveSummarizer)
    made = summarizer.summarize(SENTENCES, max_sentences=2)
    assert (made.method, made.model) == (METHOD, None)
    assert made.text == summarize(SENTENCES, max_sentences=2)
    assert made.text.startswith(tuple(SENTENCES))  # whole input sentences, nothing written anew


def test_abstractive_through_the_endpoint(settings: Settings) -> None:
    with chat_endpoint() as ep:
        summarizer = get_summarizer(_endpoint(settings, ep.url))
        assert isinstance(summarizer, EndpointSummarizer)
        made = summarizer.summarize(SENTENCES, max_sentences=2, max_chars=60)
    assert (made.method, made.model) == (ABSTRACTIVE_METHOD, "tiny-llm")
    assert made.text.startswith(PREFIX) and len(made.text) <= 60
    (request,) = ep.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == "Bearer sk-test"
    body = request["body"]
    assert body["model"] == "tiny-llm" and body["temperature"] == 0
    assert "at most 2 sentences" in body["messages"][0]["content"]
    assert body["messages"][1]["content"].splitlines() == [f"- {s}" for s in sorted(SENTENCES)]


def test_a_failing_endpoint_falls_back_and_says_so(settings: Settings,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="engram.derive.summarize")
    with chat_endpoint(fail=True) as ep:
        summarizer = get_summarizer(_endpoint(settings, ep.url))
        made = [summarizer.summarize(SENTENCES, max_sentences=2) for _ in range(MAX_FAILURES + 2)]
    assert {(m.method, m.model) for m in made} == {(METHOD, None)}
    assert {m.text for m in made} == {summarize(SENTENCES, max_sentences=2)}
    assert len(ep.requests) == MAX_FAILURES  # then it stops asking for the rest of the run
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(ep.url in w and "extractive instead" in w and "500" in w for w in warnings)
    assert any(f"failed {MAX_FAILURES} times in a row" in w for w in warnings)

    with chat_endpoint(model_reply="   ") as empty:  # a reply without text is a failure too
        made_empty = get_summarizer(_endpoint(settings, empty.url)).summarize(SENTENCES)
    assert made_empty.method == METHOD and len(empty.requests) == 1
    unreachable = get_summarizer(_endpoint(settings, f"http://127.0.0.1:{free_port()}/v1"))
    assert unreachable.summarize(SENTENCES).method == METHOD


def test_endpoint_settings_are_checked(settings: Settings) -> None:
    with pytest.raises(BadInput, match="summary_endpoint_model"):
        get_summarizer(settings.model_copy(update={"summary_endpoint_url": "http://127.0.0.1:1/v1"}))
    with pytest.raises(BadInput, match="summary_endpoint_url"):
        get_summarizer(settings.model_copy(update={"summary_endpoint_model": "m"}))
    with pytest.raises(BadInput, match="http"):
        get_summarizer(settings.model_copy(update={"summary_endpoint_url": "ftp://x",
                                                   "summary_endpoint_model": "m"}))


def _seed(app_engine: Engine, t: TenantFixture, embedder: Any, settings: Settings) -> None:
    ident = t.identity(write=("team",))
    with bound_session(app_engine, ident) as s:
        ids: dict[str, uuid.UUID] = {}
        for name in ("Ada", "Babbage", "Engine"):
            found = resolve_entity(s, "person" if name != "Engine" else "thing", name, ("team",))
            assert found is not None
            ids[name] = found
        for a, b, sentence in [("Ada", "Babbage", "Ada corresponded with Babbage."),
                               ("Babbage", "Engine", "Babbage designed the engine."),
                               ("Ada", "Engine", "Ada programmed the engine.")]:
            assert assert_relation(s, ids[a], "related_to", ids[b], sentence, ("team",)).claim_id
        assert assert_fact(s, FactInput(subject_id=ids["Ada"], predicate="note", scopes=("team",),
                                        text="Ada was a mathematician.", value="mathematician")).claim_id
    write_documents(app_engine, ident, embedder, [
        doc(f"d{i}.md", f"d{i}", body) for i, body in enumerate([
            "The analytical engine was never finished.", "Ada wrote the first published program.",
            "Babbage also designed a difference engine.", "The engine used punched cards."])], settings)


def _made(app_engine: Engine, t: TenantFixture) -> dict[str, set[tuple[str, str | None]]]:
    with bound_session(app_engine, t.identity(read=("team",))) as s:
        return {name: {(method, model) for method, model in s.execute(
                    select(m.summary_method, m.summary_model))}
                for name, m in (("communities", Community), ("profiles", Profile), ("raptor", RaptorNode))}


def _each(method: str, model: str | None) -> dict[str, set[tuple[str, str | None]]]:
    """What each job records for ``method``: RAPTOR adds how it chose a leaf's sentences."""
    return {"communities": {(method, model)}, "profiles": {(method, model)},
            "raptor": {(method + raptor.SENTENCES, model)}}


def test_every_job_records_method_and_model(app_engine: Engine, tenant_factory: Tenants, embedder: Any,
                                            settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    t = tenant_factory("team")
    _seed(app_engine, t, embedder, settings)
    ident = t.identity(write=("team",))

    def run(cfg: Settings) -> tuple[Any, Any, Any]:
        with bound_session(app_engine, ident) as s:
            return (communities.rebuild(s, settings=cfg), profiles.refresh(s, settings=cfg),
                    raptor.build(s, settings=cfg))

    with chat_endpoint() as ep:
        abstractive = _endpoint(settings, ep.url)
        c1, p1, r1 = run(abstractive)
        assert (c1.inserted, p1.inserted) == (1, 2) and r1.inserted >= 1
        assert _made(app_engine, t) == _each(ABSTRACTIVE_METHOD, "tiny-llm")
        with bound_session(app_engine, ident) as s:
            summaries = list(s.execute(select(RaptorNode.summary)).scalars())
        assert all(x.startswith(PREFIX) for x in summaries)
        asked = len(ep.requests)
        c2, p2, r2 = run(abstractive)  # the endpoint answers the same: nothing changes
        assert (c2.updated, p2.updated, r2.updated, r2.inserted) == (0, 0, 0, 0)
        assert len(ep.requests) == asked  # unchanged input (digests): nothing is summarised again
    # Back to extractive: every summary is remade by the configured method, and says so.
    c3, p3, r3 = run(settings)
    assert (c3.updated, p3.updated, r3.updated) == (1, 2, r1.inserted)
    assert _made(app_engine, t) == _each(METHOD, None)
    # A failing endpoint leaves the extractive summaries as they are (nothing written), and warns.
    caplog.set_level(logging.WARNING, logger="engram.derive.summarize")
    with chat_endpoint(fail=True) as down:
        c4, p4, r4 = run(_endpoint(settings, down.url))
    assert (c4.updated, p4.updated, r4.updated, r4.inserted) == (0, 0, 0, 0)
    assert r4.resummarised == r1.inserted and r4.unchanged == r1.inserted
    assert any("extractive instead" in r.getMessage() for r in caplog.records)
    assert _made(app_engine, t) == _each(METHOD, None)
