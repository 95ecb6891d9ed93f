"""A bounded cache of query embeddings, per tenant and per embedding model.

Why: agents ask the same question more than once (a retry, a prompt hook that asks
on every turn, several tools of one agent), and embedding it is the largest fixed
cost of a small tenant's recall (5-30 ms of MiniLM on a shared CPU core). The vector
of ``"{asker}: {question}"`` depends only on that text and the model, so it can be
kept.

Two rules make the cache safe to share in one process:

* the key holds the **tenant**: a hit is faster than a miss, so a shared entry would
  tell one tenant that another asked the same question; each tenant hits only its own
  entries;
* the key holds the **model** (name and version, ``model_key``): after the active
  model changes, a question is embedded again by the new model and never answered
  with a vector of the old one.

Entries are least-recently-used, at most ``recall_query_cache_size`` of them (0 turns
the cache off); a vector is returned read-only, so no caller can change a cached one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

Key = tuple[str, tuple[str, str], str, str]


def model_key(embedder: Any) -> tuple[str, str]:
    """(name, version) of the model behind ``embedder``; the version is whatever the
    embedder says it is (``model_version``), else where its weights came from."""
    name = str(getattr(embedder, "model_name", type(embedder).__name__))
    version = getattr(embedder, "model_version", None) or getattr(embedder, "source", None) or ""
    return name, str(version)


class QueryEmbeddingCache:
    """LRU map of (tenant, model, asker, question) to the query's vector (thread safe)."""

    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        self._entries: OrderedDict[Key, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get_or_embed(self, tenant: str, model: tuple[str, str], question: str, asker: str | None,
                     embed: Callable[[], Any]) -> tuple[Any, bool]:
        """The vector and whether it came from the cache; ``embed()`` computes a missing one."""
        if self.size == 0:
            return embed(), False
        key: Key = (tenant, model, asker or "", question)
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return found, True
            self.misses += 1
        vector = np.array(embed(), dtype=np.float32)
        vector.setflags(write=False)
        with self._lock:
            self._entries[key] = vector
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return vector, False
