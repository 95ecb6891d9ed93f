"""Summaries for the derive jobs, and which method and model made each one.

**Extractive** (the default, no language model): sentences are TF-IDF vectors
over the evidence itself. The first pick is the sentence closest to the
centroid (what the evidence is mostly about); each next pick maximises
``λ·sim(s, centroid) − (1−λ)·max sim(s, picked)`` so the summary covers several
aspects instead of repeating one. Deterministic: ties break on the sentence
text, so an unchanged input always yields the same summary.

**Abstractive**, when ``summary_endpoint_url`` and ``summary_endpoint_model``
are set: the evidence goes to an OpenAI-compatible ``/chat/completions``
endpoint (temperature 0). A failing endpoint never fails a job: that summary
falls back to the extractive one (and says so in the log), and after a few
failures in a row the summarizer stops asking for the rest of its run.

Every ``Summary`` carries its ``method`` and ``model``, which the jobs store in
``summary_method`` / ``summary_model``.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from orchestrator.config import Settings, get_settings
from orchestrator.errors import BadInput

METHOD = "extractive:centroid-mmr"
# How an extractive summary is put together from its picked sentences; part of every stored
# summary's input digest (``digest.input_digest``), so a change here re-summarises each
# profile and community once. 2: a picked sentence without end punctuation gets a full stop.
FORM = 2
ABSTRACTIVE_METHOD = "abstractive:openai-compatible"
# Consecutive endpoint failures after which a summarizer stops calling it for its run.
MAX_FAILURES = 3
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n\s*\n")
# A sentence that ends a thought: end punctuation, perhaps inside a closing quote or bracket.
# End punctuation, then any closing quotes, brackets or Markdown emphasis ("*Really?*").
_ENDED = re.compile(r"[.!?\u2026][\"'\u201d\u2019)\]*_~]*$")
log = logging.getLogger("engram.derive.summarize")

SYSTEM_PROMPT = (
    "You summarise evidence for an AI agent's long-term memory. Write plain prose, at most "
    "{sentences} sentences and {chars} characters. Use only what the evidence states; never add "
    "facts, opinions or instructions. Evidence items are separated by lines starting with '- '."
)


def _vectors(sentences: Sequence[str]) -> list[dict[str, float]]:
    bags = [Counter(w.lower() for w in _WORD.findall(s)) for s in sentences]
    df = Counter(w for bag in bags for w in bag)
    n = len(sentences)
    out = []
    for bag in bags:
        vec = {w: (1 + math.log(c)) * math.log((1 + n) / (1 + df[w]) + 1) for w, c in bag.items()}
        norm = math.sqrt(sum(v * v for v in vec.values())) or 1.0
        out.append({w: v / norm for w, v in vec.items()})
    return out


def _cos(a: dict[str, float], b: dict[str, float]) -> float:
    if len(a) > len(b):
        a, b = b, a
    return sum(v * b.get(w, 0.0) for w, v in a.items())


def summarize(sentences: Sequence[str], *, max_sentences: int = 3, max_chars: int = 2000,
              diversity: float = 0.3) -> str:
    """Pick up to ``max_sentences`` representative, mutually different sentences."""
    unique = sorted({s.strip() for s in sentences if s and s.strip()})
    if not unique:
        return ""
    vecs = _vectors(unique)
    centroid: dict[str, float] = {}
    for vec in vecs:
        for w, v in vec.items():
            centroid[w] = centroid.get(w, 0.0) + v / len(vecs)
    relevance = [_cos(v, centroid) for v in vecs]
    picked: list[int] = []
    while len(picked) < min(max_sentences, len(unique)):
        def score(i: int) -> tuple[float, int]:
            redundancy = max((_cos(vecs[i], vecs[j]) for j in picked), default=0.0)
            # Rounded so float noise never decides; then the alphabetically first wins.
            return round((1 - diversity) * relevance[i] - diversity * redundancy, 9), -i
        picked.append(max((i for i in range(len(unique)) if i not in picked), key=score))
    text = " ".join(ended(unique[i]) for i in picked)
    return text[:max_chars]


def ended(sentence: str) -> str:
    """``sentence`` with end punctuation: a list item or heading picked as a sentence
    ("Attendees: Tomás, Priya") would otherwise run into the next one in a summary; a
    trailing comma, colon or semicolon gives way to the full stop."""
    s = sentence.strip()
    return s if not s or _ENDED.search(s) else s.rstrip(",;:").rstrip() + "."


def split_sentences(text: str) -> list[str]:
    """A passage cut into sentences (end punctuation or a blank line); for chunk text."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]


@dataclass(frozen=True)
class Summary:
    text: str
    method: str
    model: str | None


class Summarizer(Protocol):
    """What the derive jobs call; ``method``/``model`` name what a successful call records."""

    method: str
    model: str | None

    def summarize(self, sentences: Sequence[str], *, max_sentences: int = 3,
                  max_chars: int = 2000) -> Summary: ...


class ExtractiveSummarizer:
    """Centroid/MMR sentence selection (``summarize``); records no model."""

    method = METHOD
    model: str | None = None

    def summarize(self, sentences: Sequence[str], *, max_sentences: int = 3,
                  max_chars: int = 2000) -> Summary:
        return Summary(summarize(sentences, max_sentences=max_sentences, max_chars=max_chars), METHOD, None)


class EndpointSummarizer:
    """Abstractive summaries from an OpenAI-compatible chat-completions endpoint.

    Falls back to ``fallback`` (extractive) for any summary the endpoint cannot
    give: a transport error, a non-2xx answer, or a reply without text.
    """

    method = ABSTRACTIVE_METHOD

    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout_s: float = 30.0,
                 max_tokens: int = 400, max_input_chars: int = 16_000,
                 fallback: ExtractiveSummarizer | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise BadInput(f"summary_endpoint_url must be an http(s) URL, got {url!r}")
        if not model:
            raise BadInput("summary_endpoint_model must name the model to ask")
        if timeout_s <= 0 or max_tokens < 1 or max_input_chars < 100:
            raise BadInput("summary endpoint limits: timeout_s > 0, max_tokens >= 1, "
                           "max_input_chars >= 100")
        self.url = url.rstrip("/") + "/chat/completions"
        self.model: str | None = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.max_tokens = max_tokens
        self.max_input_chars = max_input_chars
        self.fallback = fallback or ExtractiveSummarizer()
        self.failures = 0
        self.fallbacks = 0

    def _request(self, evidence: list[str], max_sentences: int, max_chars: int) -> str:
        headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        body: dict[str, Any] = {
            "model": self.model, "temperature": 0, "max_tokens": self.max_tokens,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT.format(sentences=max_sentences, chars=max_chars)},
                {"role": "user", "content": "\n".join(f"- {s}" for s in evidence)},
            ],
        }
        response = httpx.post(self.url, json=body, headers=headers, timeout=self.timeout_s)
        response.raise_for_status()
        content = response.json()["choices"][0]["message"]["content"]
        if not isinstance(content, str) or not content.strip():
            raise ValueError("the reply has no text")
        return content.strip()

    def summarize(self, sentences: Sequence[str], *, max_sentences: int = 3,
                  max_chars: int = 2000) -> Summary:
        evidence: list[str] = []
        used = 0
        for s in sorted({s.strip() for s in sentences if s and s.strip()}):
            if used + len(s) > self.max_input_chars:
                break
            evidence.append(s)
            used += len(s) + 3
        if not evidence:
            return Summary("", self.method, self.model)
        if self.failures < MAX_FAILURES:
            try:
                text = self._request(evidence, max_sentences, max_chars)
                self.failures = 0
                return Summary(text[:max_chars], self.method, self.model)
            except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
                self.failures += 1
                log.warning("summary endpoint %s failed (%s: %s); this summary is extractive instead",
                            self.url, type(exc).__name__, exc)
                if self.failures == MAX_FAILURES:
                    log.warning("summary endpoint %s failed %d times in a row; the rest of this run "
                                "is summarised extractively", self.url, MAX_FAILURES)
        self.fallbacks += 1
        return self.fallback.summarize(sentences, max_sentences=max_sentences, max_chars=max_chars)


def get_summarizer(settings: Settings | None = None) -> ExtractiveSummarizer | EndpointSummarizer:
    """The summarizer the settings configure: abstractive when an endpoint is set, else extractive."""
    settings = settings or get_settings()
    url, model = settings.summary_endpoint_url, settings.summary_endpoint_model
    if not url and not model:
        return ExtractiveSummarizer()
    if not url or not model:
        raise BadInput("set both summary_endpoint_url and summary_endpoint_model (ENGRAM_SUMMARY_ENDPOINT_*) "
                       "for abstractive summaries, or neither for extractive ones")
    return EndpointSummarizer(url, model, api_key=settings.summary_endpoint_api_key,
                              timeout_s=settings.summary_endpoint_timeout_s,
                              max_tokens=settings.summary_endpoint_max_tokens,
                              max_input_chars=settings.summary_endpoint_max_input_chars)
