"""Embedder with the real packaged MiniLM; Reranker mechanics with a tiny cross-encoder."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import numpy as np
import pytest

from orchestrator.config import Settings
from orchestrator.errors import BadInput
from orchestrator.worker.device import choose_device
from orchestrator.worker.embedder import Embedder, ModelUnavailable, Reranker
from tests.support.worker import build_tiny_cross_encoder


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder.from_settings(Settings())


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("tiny") / "cross-encoder")


@pytest.fixture(scope="module")
def reranker(tiny_dir: Path) -> Reranker:
    settings = Settings(reranker_model="tests/tiny-cross-encoder", reranker_model_path=tiny_dir,
                        rerank_batch_size=4, reranker_window_overlap_tokens=16)
    return Reranker.from_settings(settings)


# -- embedder ----------------------------------------------------------------------

def test_packaged_model_shapes_and_unit_length(embedder: Embedder) -> None:
    assert embedder.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert embedder.dimension == 384
    assert embedder.max_seq_length == 256
    vectors = embedder.embed_passages(["the cat sat on the mat", "quarterly revenue grew", "x"])
    assert vectors.shape == (3, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    query = embedder.embed_query("where did the cat sit?")
    assert query.shape == (384,) and query.dtype == np.float32
    assert abs(float(np.linalg.norm(query)) - 1.0) < 1e-5
    assert embedder.embed_passages([]).shape == (0, 384)


def test_similar_texts_are_closer(embedder: Embedder) -> None:
    q = embedder.embed_query("where did the cat sit?")
    near, far = embedder.embed_passages(["the cat sat on the mat", "quarterly revenue grew"])
    assert float(q @ near) > float(q @ far) + 0.2


def test_query_is_asker_aware(embedder: Embedder) -> None:
    assert embedder.format_query("who is my manager?", "alice") == "alice: who is my manager?"
    assert embedder.format_query("who is my manager?", "  ") == "who is my manager?"
    with_asker = embedder.embed_query("who is my manager?", asker="alice")
    as_text = embedder.embed_passages(["alice: who is my manager?"])[0]
    np.testing.assert_allclose(with_asker, as_text, atol=1e-5)
    other = embedder.embed_query("who is my manager?", asker="bob")
    plain = embedder.embed_query("who is my manager?")
    assert float(with_asker @ other) < 0.9999 and float(with_asker @ plain) < 0.9999


def test_query_and_passage_prefixes(embedder: Embedder) -> None:
    e5_style = Embedder(embedder._model, model_name="e5-style", device=embedder.device,
                        batch_size=8, query_prefix="query: ", passage_prefix="passage: ")
    assert e5_style.format_query("what is it", "ann") == "query: ann: what is it"
    assert e5_style.format_passage("a text") == "passage: a text"
    np.testing.assert_allclose(e5_style.embed_passages(["a text"])[0],
                               embedder.embed_passages(["passage: a text"])[0], atol=1e-5)


def test_bad_input_is_refused(embedder: Embedder) -> None:
    with pytest.raises(BadInput, match="a list of texts, not one text"):
        embedder.embed_passages("just one string")
    with pytest.raises(BadInput, match=r"texts\[1\] must be text, not int"):
        embedder.embed_passages(["fine", 3])  # type: ignore[list-item]
    with pytest.raises(BadInput, match="non-empty"):
        embedder.embed_query("   ")
    calls = embedder.stats.calls
    with pytest.raises(BadInput):
        embedder.embed_passages(["ok", None])  # type: ignore[list-item]
    assert embedder.stats.calls == calls, "refused before any model call"


def test_from_settings_is_cached_per_process(embedder: Embedder) -> None:
    assert Embedder.from_settings(Settings()) is embedder


def test_missing_embedding_model_falls_back_to_the_packaged_one(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="engram.worker"):
        e = Embedder.from_settings(Settings(embedding_model="nobody/no-such-model"))
    assert e.model_name == "sentence-transformers/all-MiniLM-L6-v2"
    assert any("nobody/no-such-model is not on this machine" in r.message for r in caplog.records)


def test_device_override_is_checked() -> None:
    import torch

    assert choose_device(Settings(device="cpu")).device == "cpu"
    with pytest.raises(BadInput, match="not a device"):
        choose_device(Settings(device="tpu"))
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="torch sees no CUDA device"):
            choose_device(Settings(device="cuda"))
        assert choose_device(Settings()).device == "cpu"


def test_one_text_on_the_cpu_goes_through_the_trace_and_gives_what_encode_gives(
        embedder: Embedder) -> None:
    texts = ["where did the cat sit?", "x",
             "a much longer question, with commas, numbers like 2024 and " + "many words " * 40]
    queries = [embedder.embed_query(t) for t in texts]
    assert embedder.one_text_path == "traced"
    reference = embedder._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True,
                                       show_progress_bar=False)
    for got, want in zip(queries, reference, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5)
    # Batches still go through encode, and one text of a batch is the same vector as alone.
    batch = embedder.embed_formatted(texts)
    np.testing.assert_allclose(batch, np.stack(queries), atol=1e-5)


def test_a_question_never_waits_for_a_batch_in_flight(
        embedder: Embedder, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under `engram up` the worker embeds batches of passages with the same model: a batch of
    64 chunks took about 5 s on one core, and a recall's question waited for it (embed 3-5 s
    in the trace). The one-text path has a lock and a tokenizer of its own."""
    import threading

    question = "where did the cat sit?"
    want = embedder.embed_query(question)  # the one-text path is built
    entered, release = threading.Event(), threading.Event()
    encode = embedder._model.encode

    def slow_encode(*args, **kwargs):  # type: ignore[no-untyped-def]
        entered.set()
        assert release.wait(60), "the test never released the batch"
        return encode(*args, **kwargs)

    monkeypatch.setattr(embedder._model, "encode", slow_encode)
    batch: list[object] = []
    worker = threading.Thread(target=lambda: batch.append(embedder.embed_passages(["a", "b"])))
    worker.start()
    try:
        assert entered.wait(60)
        got: list[object] = []
        asker = threading.Thread(target=lambda: got.append(embedder.embed_query(question)))
        asker.start()
        asker.join(30)
        assert got, "the question waited for the batch in flight"
        np.testing.assert_allclose(got[0], want, atol=1e-6)  # type: ignore[arg-type]
        assert worker.is_alive() and not batch, "the batch was still in flight"
    finally:
        release.set()
        worker.join(60)
    assert batch and np.asarray(batch[0]).shape == (2, embedder.dimension)


def test_the_trace_can_be_turned_off() -> None:
    off = Embedder.from_settings(Settings(embed_one_text_trace=False))
    assert off is not Embedder.from_settings(Settings())
    v = off.embed_query("where did the cat sit?")
    assert off._one is None and off.one_text_path == "encode (embed_one_text_trace is off)"
    np.testing.assert_allclose(v, Embedder.from_settings(Settings()).embed_query("where did the cat sit?"),
                               atol=1e-5)


def test_a_model_the_trace_cannot_take_keeps_encode_and_says_why(
        embedder: Embedder, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.worker.embedder import _OneText

    class NoTransformer:
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter([object()])

    path, why = _OneText.build(NoTransformer(), embedder.device)
    assert path is None and why == "not traced: the first module is object"

    class Broken(list):  # type: ignore[type-arg]
        def preprocess(self, texts):  # type: ignore[no-untyped-def]
            raise ValueError("cannot tokenize")

    first = embedder._model[0]
    with caplog.at_level(logging.WARNING, logger="engram.worker"):
        path, why = _OneText.build(Broken([first]), embedder.device)
    assert path is None and why == "not traced: ValueError: cannot tokenize"
    assert "one-text embedding path not used: cannot tokenize" in caplog.text
    # A trace that does not reproduce encode on the probes is not used.
    monkeypatch.setattr(_OneText, "TOLERANCE", -1.0)
    path, why = _OneText.build(embedder._model, embedder.device)
    assert path is None and why.startswith("not traced: differs from encode by ")


@pytest.mark.gpu
def test_cuda_half_precision_vectors_match_cpu(embedder: Embedder) -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gpu = Embedder.from_settings(Settings(device="cuda"))
    assert gpu.device.half and gpu.batch_size > embedder.batch_size
    texts = ["the cat sat on the mat", "quarterly revenue grew"]
    cosine = np.sum(gpu.embed_passages(texts) * embedder.embed_passages(texts), axis=1)
    assert np.all(cosine > 0.999)


# -- reranker ----------------------------------------------------------------------

def test_tiny_reranker_loads_with_its_window(reranker: Reranker) -> None:
    assert reranker.available and reranker.note is None
    assert reranker.max_length == 128
    assert reranker.model_name == "tests/tiny-cross-encoder"


def test_batching_matches_one_by_one(reranker: Reranker) -> None:
    passages = [f"passage {i} talks about {'apples' if i % 2 else 'trains'}" for i in range(10)]
    before = reranker.stats.calls
    batched = reranker.score("which fruit?", passages)
    assert reranker.stats.calls - before == 3, "10 pairs in batches of 4"
    single = [reranker.score("which fruit?", [p])[0] for p in passages]
    np.testing.assert_allclose(batched, single, atol=1e-4)


def test_scores_follow_their_passages(reranker: Reranker) -> None:
    passages = ["red apples and pears", "a long train journey", "fruit salad recipe", "x y z"]
    scores = reranker.score("fruit", passages)
    permuted = reranker.score("fruit", passages[::-1])
    np.testing.assert_allclose(permuted, scores[::-1], atol=1e-4)
    order = sorted(range(4), key=lambda i: -scores[i])
    assert [passages[i] for i in order] == [
        p for _, p in sorted(zip(scores, passages, strict=True), key=lambda t: -t[0])]


def test_long_passage_is_scored_in_overlapping_windows(reranker: Reranker) -> None:
    words = [f"w{i}" for i in range(400)]
    passage = " ".join(words)
    query, windows = reranker.windows("what is here", passage)
    assert query == "what is here"
    assert len(windows) > 1
    assert passage.startswith(windows[0]) and passage.endswith(windows[-1])
    for a, b in itertools.pairwise(windows):
        assert a.split()[-1] in b.split(), "consecutive windows overlap"
    covered = set()
    for w in windows:
        covered.update(w.split())
    assert covered == set(words), "every token of the passage is read by some window"
    outcome = reranker.score_detailed("what is here", [passage, "short"])
    assert outcome.windows[0] == len(windows) and outcome.windows[1] == 1
    assert outcome.notes and "exceed its 128-token window" in outcome.notes[0]
    per_window = reranker.score("what is here", windows)
    assert outcome.scores[0] == pytest.approx(max(per_window), abs=1e-4)
    assert reranker.score_detailed("what is here", ["short"]).notes == []


def test_overlong_query_is_shortened_and_said(reranker: Reranker) -> None:
    outcome = reranker.score_detailed("question " * 200, ["a passage"])
    assert any("query was shortened" in n for n in outcome.notes)


def test_missing_reranker_is_reported_once_and_never_crashes(
        caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    settings = Settings(reranker_model="BAAI/bge-reranker-v2-m3",
                        reranker_model_path=None, rerank_batch_size=3)
    with caplog.at_level(logging.WARNING, logger="engram.worker"):
        first = Reranker.from_settings(settings)
        again = Reranker.from_settings(settings)
    assert first is again and not first.available
    assert first.note is not None and "BAAI/bge-reranker-v2-m3 is not on this machine" in first.note
    assert sum("bge-reranker-v2-m3" in r.message for r in caplog.records) == 1
    with pytest.raises(ModelUnavailable, match="not on this machine"):
        first.score("q", ["p"])

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    bad = Reranker.from_settings(Settings(reranker_model="broken", reranker_model_path=broken))
    assert not bad.available and bad.note is not None and "cannot load reranker" in bad.note


def test_reranker_bad_input(reranker: Reranker) -> None:
    with pytest.raises(BadInput, match="non-empty"):
        reranker.score("", ["p"])
    with pytest.raises(BadInput, match=r"passages\[0\] must be text"):
        reranker.score("q", [1])  # type: ignore[list-item]
    assert reranker.score("q", []) == []
