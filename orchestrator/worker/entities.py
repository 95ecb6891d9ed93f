"""GLiNER: the optional zero-shot entity backend of extraction (``orchestrator.derive.nlp``).

It lives in the worker package because GLiNER runs on torch. It is used only
when ``ENGRAM_GLINER_MODEL`` names a local directory holding a GLiNER model
(``gliner_config.json`` and ``model.safetensors`` or ``pytorch_model.bin``) and
the optional ``gliner`` package is installed (``pip install 'engram[gliner]'``).
Loading is offline (``local_files_only``, and ``orchestrator.worker.models``
sets ``HF_HUB_OFFLINE``): a model whose files are incomplete fails to load and
is reported, never fetched. Every failure is a string saying what is missing,
so extraction falls back to the packaged spaCy model and says so.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from orchestrator.derive.nlp import Mention
from orchestrator.worker import models as _offline  # noqa: F401  (sets HF_HUB_OFFLINE first)

GLINER_CONFIG = "gliner_config.json"
GLINER_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


def gliner_status(path: Path | None) -> tuple[bool, str]:
    """Whether a GLiNER model can be tried at ``path``, and a sentence saying why (not)."""
    if path is None:
        return False, "GLiNER is not configured (ENGRAM_GLINER_MODEL is unset)"
    if not path.is_dir():
        return False, f"GLiNER model {path} (ENGRAM_GLINER_MODEL) is not on this machine"
    if not (path / GLINER_CONFIG).is_file():
        return False, f"GLiNER model {path} has no {GLINER_CONFIG}"
    if not any((path / w).is_file() for w in GLINER_WEIGHTS):
        return False, f"GLiNER model {path} has no weights ({' or '.join(GLINER_WEIGHTS)})"
    if importlib.util.find_spec("gliner") is None:
        return False, (f"GLiNER model {path} is present but the optional gliner package is not "
                       "installed (pip install 'engram[gliner]')")
    return True, f"GLiNER model {path}"


def entity_type(label: str) -> str:
    """A GLiNER label as an Engram entity type: ``Programming language`` -> ``programming_language``."""
    return re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_") or "thing"


class GlinerEntities:
    """Zero-shot entity mentions for the configured labels."""

    def __init__(self, model: Any, path: Path, labels: Sequence[str], threshold: float) -> None:
        self.model = model
        self.labels = list(labels)
        self.threshold = threshold
        self.name = f"gliner:{path.name}:{','.join(entity_type(x) for x in labels)}@{threshold:g}"

    def _predict(self, texts: list[str]) -> list[list[dict[str, Any]]]:
        # The method's name changed across gliner releases; all return one list per text.
        for method in ("inference", "batch_predict_entities"):
            fn = getattr(self.model, method, None)
            if fn is not None:
                return list(fn(texts, self.labels, threshold=self.threshold))
        return [list(self.model.predict_entities(t, self.labels, threshold=self.threshold)) for t in texts]

    def mentions(self, texts: Sequence[str], docs: Sequence[Any]) -> list[list[Mention]]:
        found = self._predict(list(texts))
        return [[Mention(int(e["start"]), int(e["end"]), entity_type(str(e["label"]))) for e in spans]
                for spans in found]


def load_gliner(path: Path, labels: tuple[str, ...], threshold: float) -> GlinerEntities | str:
    """The loaded backend, or why there is none. The files are checked on every call (cheap:
    weights placed later are found); a load is made once per process."""
    usable, note = gliner_status(path)
    if not usable:
        return note
    if not labels:
        return "GLiNER needs at least one label (ENGRAM_GLINER_LABELS is empty)"
    return _load(path, labels, threshold)


@lru_cache(maxsize=2)
def _load(path: Path, labels: tuple[str, ...], threshold: float) -> GlinerEntities | str:
    try:
        from gliner import GLiNER

        model = GLiNER.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:  # an incomplete or foreign model directory: report, fall back
        return f"GLiNER model {path} did not load ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    return GlinerEntities(model, path, labels, threshold)
