"""Labelled ranking groups for the learned ranker: collected from recall traces, saved, trained on.

A *group* is one question: the feature rows of every candidate its recall saw
(``trace.ranking``, computed by the same code the product runs) and a binary
label per row (the candidate is, or was extracted from, an evidence item). The
benchmarks collect groups with the ``fused`` plan shape (features do not depend
on the model), train LambdaRank on some and score others:

* ``benchmarks/recall_quality.py --cv``: cross-validation by conversation on
  LoCoMo dev (train on three conversations, score the fourth through a real
  recall with that fold's model);
* ``benchmarks/train_ranker.py``: the shipped default model, trained on every
  LoCoMo dev conversation and the FanOutQA dev sub-questions, and nothing else.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.recall.features import FEATURE_VERSION, FEATURES


def feature_code_digest() -> str:
    """A digest of the feature code: cached groups computed by other code are not reused."""
    import orchestrator.recall.features as f
    import orchestrator.recall.ppr as p

    body = Path(f.__file__).read_bytes() + Path(p.__file__).read_bytes()
    return f"{FEATURE_VERSION}-{hashlib.sha256(body).hexdigest()[:12]}"


@dataclass
class Group:
    source: str  # e.g. "locomo:conv-26", "locomo-derive:conv-26", "fanoutqa"
    matrix: np.ndarray[Any, Any]
    labels: np.ndarray[Any, Any]


def group_from_trace(trace: Any, source: str, relevant: Callable[[str], bool]) -> Group | None:
    """The group of one recall; None when the recall saw nothing relevant (nothing to learn)."""
    report = trace.ranking
    if report.features is None or report.keys is None or not report.keys:
        return None
    labels = np.array([1.0 if relevant(k) else 0.0 for k in report.keys])
    if labels.sum() == 0:
        return None
    return Group(source, np.asarray(report.features, dtype=np.float32), labels)


def save(groups: Sequence[Group], path: Path) -> None:
    np.savez_compressed(
        path, digest=np.array(feature_code_digest()),
        sources=np.array([g.source for g in groups]),
        sizes=np.array([len(g.labels) for g in groups], dtype=np.int64),
        matrix=np.concatenate([g.matrix for g in groups]) if groups else np.zeros((0, len(FEATURES))),
        labels=np.concatenate([g.labels for g in groups]) if groups else np.zeros(0))


def load(path: Path) -> list[Group] | None:
    """Groups saved by ``save``; None when absent or computed by other feature code."""
    if not path.exists():
        return None
    data = np.load(path, allow_pickle=False)
    if str(data["digest"]) != feature_code_digest():
        print(f"{path}: computed by other feature code ({data['digest']}); recomputing")
        return None
    out: list[Group] = []
    start = 0
    # Each access to an array of an npz file decompresses it again: read each once.
    matrix, labels = data["matrix"], data["labels"]
    for source, size in zip(data["sources"], data["sizes"], strict=True):
        out.append(Group(str(source), matrix[start:start + size], labels[start:start + size]))
        start += int(size)
    return out


def fit(groups: Sequence[Group], rounds: int | None = None, seed: int | None = None) -> str:
    """LambdaRank on ``groups`` (fixed parameters from ``orchestrator.recall.ranker``; ``seed``
    replaces theirs: bagging and feature sampling draw with it)."""
    from orchestrator.recall.ranker import TRAIN_ROUNDS, train

    return train(np.concatenate([g.matrix for g in groups]), np.concatenate([g.labels for g in groups]),
                 [len(g.labels) for g in groups], rounds=rounds or TRAIN_ROUNDS,
                 params=None if seed is None else {"seed": seed})


def kinds(groups: Sequence[Group]) -> list[int]:
    """The kind codes the groups hold (the card records them: see ranker.place_unseen)."""
    col = FEATURES.index("kind")
    return sorted({int(k) for g in groups for k in np.unique(g.matrix[:, col]).tolist()})


def as_model(artifact: str, trained_on: dict[str, Any], version: str, name: str = "default",
             seen: list[int] | None = None) -> Any:
    from orchestrator.recall.learning import POSITION_BIAS
    from orchestrator.recall.ranker import TRAIN_PARAMS, TRAIN_ROUNDS, model_card, model_from_text

    card = model_card(version=version, text=artifact, trained_on=trained_on,
                      params={**TRAIN_PARAMS, "rounds": TRAIN_ROUNDS}, metrics={},
                      position_bias="none: labels are judged evidence, not feedback on served "
                                    f"positions (tenant models use {POSITION_BIAS.split(' (')[0]})",
                      kinds=seen)
    return model_from_text(artifact, card, name=name), card


def write_card(card: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(card, indent=1, sort_keys=True) + "\n")
