"""The learned ranker: a LightGBM LambdaRank model over ``recall.features``, as a versioned artifact.

Order of work in a recall (``LearnedRanker.rank``, called by the tail between
fusion and the identity-aware order):

1. **which model**: the tenant's active model (``memory.rank_models``, trained
   from its own usage by ``engram rank train``) when it has one, else the
   default model that ships inside this package (``models/default_ranker.txt``
   with its card ``default_ranker.json``, trained by
   ``benchmarks/train_ranker.py`` from LoCoMo dev and FanOutQA dev only);
2. **features**: ``feature_matrix`` (plus personalized PageRank, ``recall.ppr``);
3. **scores**: one ``predict`` over every candidate (single-threaded: a recall
   is one request among many, and 200 rows do not pay for a thread pool).

A model is an artifact: LightGBM's text format, its SHA-256, a version string and
the exact feature list it was trained on. A model whose file is missing, does
not parse, fails its checksum or names another feature list is **not used**:
the recall falls back to fused (RRF) order and the trace says which model was
refused and why. Nothing here raises into a recall.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from orchestrator.recall.features import FEATURE_VERSION, FEATURES

log = logging.getLogger("engram.recall.ranker")

DEFAULT_MODEL = "default_ranker.txt"
DEFAULT_CARD = "default_ranker.json"


class ModelRefused(Exception):
    """A model artifact that cannot rank: the message says why."""


@dataclass(frozen=True)
class RankModel:
    """A loaded model and what identifies it (the trace and receipts name ``label``)."""

    name: str  # "default" or "tenant"
    version: str
    sha256: str
    booster: Any
    card: dict[str, Any]

    @property
    def label(self) -> str:
        return f"{self.name} {self.version} (sha256 {self.sha256[:12]})"

    def score(self, matrix: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        if matrix.shape[0] == 0:
            return np.zeros(0)
        return np.asarray(self.booster.predict(matrix, num_threads=1), dtype=np.float64)


def model_from_text(text: str, card: dict[str, Any], *, name: str) -> RankModel:
    """Parse an artifact; ``ModelRefused`` names what is wrong with it."""
    import lightgbm

    sha = hashlib.sha256(text.encode()).hexdigest()
    expected = card.get("sha256")
    if expected is not None and expected != sha:
        raise ModelRefused(f"checksum mismatch (card says {str(expected)[:12]}, file is {sha[:12]})")
    features = tuple(card.get("features") or ())
    if features != FEATURES or card.get("feature_version") != FEATURE_VERSION:
        raise ModelRefused(f"trained on feature set {card.get('feature_version')!r} "
                           f"({len(features)} features); this code computes {FEATURE_VERSION!r} "
                           f"({len(FEATURES)})")
    try:
        booster = lightgbm.Booster(model_str=text)
    except Exception as exc:  # LightGBM raises its own error type for a bad file
        raise ModelRefused(f"does not parse ({type(exc).__name__}: {exc})") from exc
    if booster.num_feature() != len(FEATURES):
        raise ModelRefused(f"has {booster.num_feature()} inputs, not {len(FEATURES)}")
    return RankModel(name, str(card.get("version") or sha[:12]), sha, booster, card)


@lru_cache(maxsize=1)
def _blas() -> Any:
    from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

    return ThreadpoolController()


def single_threaded_blas() -> Any:
    """A context in which BLAS runs on one thread: the tail's matrices are a few hundred rows,
    where a BLAS thread pool only adds hand-offs (and, with many recalls at once, contention);
    measured in benchmarks/ranker_cost.py. Entering and leaving costs a few microseconds."""
    return _blas().limit(limits=1, user_api="blas")


@lru_cache(maxsize=1)
def default_model() -> RankModel | str:
    """The packaged default model, or the reason it cannot be used (read once per process)."""
    try:
        folder = resources.files("orchestrator.recall") / "models"
        text = (folder / DEFAULT_MODEL).read_text()
        card = json.loads((folder / DEFAULT_CARD).read_text())
    except (OSError, ValueError) as exc:
        return f"the packaged default model cannot be read ({type(exc).__name__}: {exc})"
    try:
        return model_from_text(text, card, name="default")
    except ModelRefused as exc:
        return f"the packaged default model is refused: {exc}"
    except ImportError as exc:
        return f"lightgbm is not installed ({exc})"


def model_card(*, version: str, text: str, trained_on: dict[str, Any], params: dict[str, Any],
               metrics: dict[str, Any], position_bias: str,
               kinds: Any = None) -> dict[str, Any]:
    """What ships beside a model file (and is stored beside a tenant's model). ``kinds``: the
    kind codes (``features.KIND_CODES``) of the training rows; see ``place_unseen``."""
    card: dict[str, Any] = {"version": version, "sha256": hashlib.sha256(text.encode()).hexdigest(),
            "feature_version": FEATURE_VERSION, "features": list(FEATURES), "objective": "lambdarank",
            "trained_on": trained_on, "params": params, "metrics": metrics,
            "position_bias": position_bias}
    if kinds is not None:
        card["kinds"] = sorted({int(k) for k in np.asarray(kinds).tolist() if k == k})
    return card


def place_unseen(scores: np.ndarray[Any, Any], matrix: np.ndarray[Any, Any],
                 seen_kinds: Any) -> int:
    """Candidates of a kind the model never saw in training (a session note, a decision, a
    catalog for a model trained on dialogue) get no score of the model's own: each is put at
    the same quantile of the model's scores as its fused (RRF) score holds among the
    candidates the model knows. Changes ``scores`` in place; returns how many were placed."""
    if seen_kinds is None:
        return 0
    kind = matrix[:, FEATURES.index("kind")]
    unseen = ~np.isin(kind, np.asarray(list(seen_kinds), dtype=kind.dtype))
    if not unseen.any() or unseen.all():
        return 0
    rrf = matrix[:, FEATURES.index("rrf")].astype(np.float64)
    known_rrf = np.sort(rrf[~unseen])
    known_scores = np.sort(scores[~unseen])
    # share of known candidates fused at or below each unseen one -> that quantile of scores
    share = np.searchsorted(known_rrf, rrf[unseen], side="right") / len(known_rrf)
    scores[unseen] = np.quantile(known_scores, np.clip(share, 0.0, 1.0))
    return int(unseen.sum())


# LambdaRank settings shared by the default model and the tenants' models: small trees
# and few of them (inference is one predict over ~200 rows; the artifact stays ~100 kB).
TRAIN_PARAMS: dict[str, Any] = {
    "objective": "lambdarank", "metric": "ndcg", "ndcg_eval_at": [10], "learning_rate": 0.05,
    "num_leaves": 7, "min_data_in_leaf": 20, "feature_fraction": 0.8, "bagging_fraction": 0.8,
    "bagging_freq": 1, "lambda_l2": 1.0, "lambdarank_truncation_level": 20, "verbosity": -1,
    "seed": 7, "deterministic": True, "force_row_wise": True, "num_threads": 1,
}
TRAIN_ROUNDS = 200


def train(matrix: np.ndarray[Any, Any], labels: np.ndarray[Any, Any], groups: list[int], *,
          positions: np.ndarray[Any, Any] | None = None, rounds: int = TRAIN_ROUNDS,
          params: dict[str, Any] | None = None) -> str:
    """Train a LambdaRank model; returns it in LightGBM's text format.

    ``groups`` are the sizes of consecutive query groups (one recall each) in ``matrix``.
    ``positions`` (0-based, one per row: where the item was shown) turn on LightGBM's
    unbiased LambdaMART, which learns how much feedback each position attracts whatever
    the item, and discounts it: the position-bias correction for labels from use.
    """
    import lightgbm

    if matrix.shape[0] != len(labels) or sum(groups) != len(labels):
        raise ValueError(f"{matrix.shape[0]} rows, {len(labels)} labels, groups summing to {sum(groups)}")
    if positions is not None and len(positions) != len(labels):
        raise ValueError(f"{len(positions)} positions for {len(labels)} rows")
    data = lightgbm.Dataset(matrix, label=labels, group=groups, feature_name=list(FEATURES),
                            position=None if positions is None else np.asarray(positions, dtype=np.int32),
                            free_raw_data=False)
    booster = lightgbm.train({**TRAIN_PARAMS, **(params or {})}, data, num_boost_round=rounds)
    return str(booster.model_to_string())


@dataclass
class RankReport:
    """What the learned ranker did in one recall, for the trace and the usage row."""

    model: str = ""  # the label of the model that ordered, or "" when fused order stood
    note: str = ""
    keys: list[str] | None = None  # candidate keys, in the rows of ``features``
    features: np.ndarray[Any, Any] | None = None
    ppr: str = ""
    timings_ms: dict[str, float] | None = None


def apply_learned(candidates: list[Any], ctx: Any, model: RankModel | str | None) -> RankReport:
    """Score every candidate with ``model`` (``c.learned``); a refused or absent model leaves
    the fused order and the report says why. PPR and the features are computed either way
    (the usage row records them, so a tenant can train even while fused order stands)."""
    import time

    from orchestrator.recall.features import feature_matrix
    from orchestrator.recall.ppr import personalized_pagerank

    t0 = time.perf_counter()
    ppr = personalized_pagerank(candidates, ctx.seeds)
    ctx.ppr = ppr.scores
    t1 = time.perf_counter()
    matrix = feature_matrix(candidates, ctx)
    t2 = time.perf_counter()
    report = RankReport(keys=[c.key for c in candidates], features=matrix,
                        ppr=(f"{len(ppr.scores)} candidate(s) scored over {ppr.nodes} nodes, "
                             f"{ppr.edges} edges, {ppr.iterations} iterations" if not ppr.note
                             else ppr.note))
    if model is None or isinstance(model, str):
        report.note = f"{model or 'no learned model'}; fused order is used"
    else:
        try:
            scores = model.score(matrix)
        except Exception as exc:  # a model that fails at predict time must not fail the recall
            log.warning("learned ranker %s failed: %s", model.label, exc)
            report.note = f"{model.label} failed ({type(exc).__name__}: {exc}); fused order is used"
        else:
            placed = place_unseen(scores, matrix, model.card.get("kinds"))
            for c, s in zip(candidates, scores, strict=True):
                c.learned = float(s)
            report.model = model.label
            report.note = f"{model.label} scored {len(candidates)} candidates" + (
                f" ({placed} of kinds it was not trained on placed by their fused score)"
                if placed else "")
    t3 = time.perf_counter()
    report.timings_ms = {"ppr": (t1 - t0) * 1000, "features": (t2 - t1) * 1000,
                         "predict": (t3 - t2) * 1000}
    return report
