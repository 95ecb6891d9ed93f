"""One place the consolidation and episode jobs get their summaries from.

``orchestrator.derive.summarize`` owns summarisation. When it offers
``get_summarizer(settings)`` (extractive, or abstractive through a configured
endpoint, with its own fallback), the jobs use it, one summarizer per run;
otherwise the extractive ``summarize()`` with its ``METHOD``. Either way the
caller learns which method and model wrote the text and records it on the row
(``summary_method``, ``summary_model``).

``input_digest`` fingerprints what a summary is made from, so a job can tell
"same input as last time" without asking the summarizer again (which, with an
abstractive endpoint, is one call per summary).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.config import Settings
from orchestrator.derive import summarize as _summarize


@dataclass(frozen=True)
class Digest:
    text: str
    method: str
    model: str | None = None


class Digester:
    """Summaries for one job run (an abstractive summarizer counts its failures per run)."""

    def __init__(self, settings: Settings | None = None, *, max_chars: int = 2000) -> None:
        factory: Any = getattr(_summarize, "get_summarizer", None)
        self._summarizer: Any = factory(settings) if factory is not None and settings is not None else None
        self.max_chars = max_chars

    def __call__(self, texts: Sequence[str], *, max_sentences: int = 3) -> Digest:
        if self._summarizer is not None:
            made = self._summarizer.summarize(list(texts), max_sentences=max_sentences,
                                              max_chars=self.max_chars)
            return Digest(str(made.text), str(made.method), None if made.model is None else str(made.model))
        text = _summarize.summarize(texts, max_sentences=max_sentences, max_chars=self.max_chars)
        return Digest(text, _summarize.METHOD, None)


def input_digest(*parts: object) -> bytes:
    """SHA-256 (32 bytes) of ``parts`` in canonical JSON: equal inputs give equal digests.

    UUIDs and other non-JSON values count by their ``str``; callers sort what has
    no order of its own (claim ids, children) so a reordering is not a change.
    """
    body = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(body.encode()).digest()


def form_of(method: str) -> tuple[str, ...]:
    """What a summary's input digest adds for how ``method`` puts a summary together: the
    extractive summary's form (``summarize.FORM``), so one made the old way is made again
    once; nothing for an endpoint's (its text never went through that form)."""
    return (f"form {_summarize.FORM}",) if method == _summarize.METHOD else ()
