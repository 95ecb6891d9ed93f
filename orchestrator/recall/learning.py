"""Learning to rank from use: usage rows per recall, feedback labels, per-tenant models.

Order of work:

1. **which model ranks** (``ModelChooser``): a fixed model when an evaluation
   passes one; else the tenant's active model (``memory.rank_models``, read
   under the asker's RLS, cached per tenant for ``rank_model_refresh_s``); else
   the packaged default (``ranker.default_model``). A stored model that does
   not load is refused, said in the trace, and the default ranks instead;
2. **usage rows** (``record_usage``): every recall and memory_prepare writes, in
   one statement, a ``memory.rank_events`` row (served items with their served
   rank, plus the best ``rank_usage_pooled`` pooled items that were not served,
   each with its feature vector, the model that ranked and the receipt) and one
   ``memory.usage_ledger`` row per served item (operation ``recall.served`` or
   ``prepare.served``, with the channel), so the ledger counts what was served
   and ``mark_used`` says what was used;
3. **training** (``train_tenant``, ``engram rank train``): as the derive service
   identity, read the tenant's events with labels (``memory.rank_training_rows``:
   an item is positive when its user sent ``mark_used`` for it within
   ``rank_label_window_s``; served-not-used and pooled-not-served items are
   negatives); hold back the newest ``rank_holdout_share`` of events; train
   LambdaRank on the rest with **position-bias correction by LightGBM's unbiased
   LambdaMART** (each row's served position is given to the learner, which
   estimates how much feedback a position attracts regardless of relevance and
   discounts it; pooled-not-served rows share one position past the last served
   one); score the held-back events with the new model, the active model and
   fused order (nDCG@10 against the feedback labels); store the model with its
   card, and activate it only when it beats the active one there.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select, text, update
from sqlalchemy.orm import Session

from orchestrator.config import Settings
from orchestrator.db.rank_models import StoredRankModel
from orchestrator.errors import BadInput, NotFound
from orchestrator.recall.features import FEATURE_VERSION, FEATURES
from orchestrator.recall.ranker import (
    ModelRefused,
    RankModel,
    RankReport,
    default_model,
    model_card,
    model_from_text,
    train,
)

OPERATIONS = ("recall", "prepare")
CHANNELS = ("graphql", "mcp", "python", "cli", "worker", "rest")
POSITION_BIAS = ("unbiased LambdaMART (LightGBM lambdarank_position_bias_regularization over the "
                 "served position; pooled-not-served rows share the position after the last served)")


class ModelChooser:
    """The model for a recall: fixed, the tenant's active one, or the packaged default."""

    def __init__(self, settings: Settings, fixed: RankModel | str | None = None) -> None:
        self.settings = settings
        self.fixed = fixed
        self._has_fixed = fixed is not None
        # org -> (read at, (stored id, model or refusal) or None)
        self._cache: dict[str, tuple[float, tuple[uuid.UUID, RankModel | str] | None]] = {}

    def without_tenant(self) -> RankModel | str:
        """The model a recall gets when its tenant has none of its own (the fixed one, or the
        packaged default): what the server's warm-up loads."""
        return self.fixed if self._has_fixed and self.fixed is not None else default_model()

    def model_for(self, session: Session, org: str
                  ) -> tuple[RankModel | str, uuid.UUID | None, str | None]:
        """(the model, or the reason there is none; the stored model's id when a tenant model
        ranks; why the tenant's own model was refused, when it was)."""
        if self._has_fixed:
            assert self.fixed is not None
            return self.fixed, None, None
        now = time.monotonic()
        cached = self._cache.get(org)
        if cached is None or now - cached[0] > self.settings.rank_model_refresh_s:
            cached = (now, self.stored(session))
            self._cache[org] = cached
        stored = cached[1]
        if stored is not None and isinstance(stored[1], RankModel):
            return stored[1], stored[0], None
        return self.without_tenant(), None, None if stored is None else str(stored[1])

    def stored(self, session: Session) -> tuple[uuid.UUID, RankModel | str] | None:
        """The bound tenant's active stored model (or why it is refused); None when it has
        none (and with no identity bound)."""
        row = session.execute(select(StoredRankModel.id, StoredRankModel.version, StoredRankModel.artifact,
                                     StoredRankModel.card)
                              .where(StoredRankModel.active)).first()
        if row is None:
            return None
        card = dict(row.card)
        card.setdefault("version", f"v{row.version}")
        try:
            return row.id, model_from_text(row.artifact, card, name="tenant")
        except ModelRefused as exc:
            return row.id, f"the tenant's model v{row.version} is refused: {exc}"


# --- 2. usage rows -------------------------------------------------------------------------


def usage_params(*, operation: str, channel: str, question: str, report: RankReport,
                 served: Sequence[tuple[str, uuid.UUID]], pooled: Sequence[Any],
                 model_id: uuid.UUID | None, receipt_id: uuid.UUID | None,
                 pooled_limit: int) -> dict[str, Any] | None:
    """What ``write_usage`` writes for one recall (None: nothing to write), checked now; the
    feature rows stay a matrix (copied out of the report) until the writer formats them.

    ``served`` are the served rows in order; ``pooled`` the candidates in final order
    (served first), whose feature rows are in ``report``.
    """
    if operation not in OPERATIONS:
        raise BadInput(f"unknown operation {operation!r}; one of {', '.join(OPERATIONS)}")
    if channel not in CHANNELS:
        raise BadInput(f"unknown channel {channel!r}; one of {', '.join(CHANNELS)}")
    if report.features is None or report.keys is None:
        return None
    row_of = {k: i for i, k in enumerate(report.keys)}
    rank_of = {item: n for n, item in enumerate(served, 1)}
    tables: list[str] = []
    ids: list[uuid.UUID] = []
    docs: list[uuid.UUID | None] = []
    ranks: list[int] = []
    rows: list[int] = []
    extra = 0
    for c in pooled:
        if c.item_table is None or c.item_id is None or c.key not in row_of:
            continue
        rank = rank_of.get((c.item_table, c.item_id), 0)
        if rank == 0:
            if extra >= pooled_limit:
                continue
            extra += 1
        tables.append(c.item_table)
        ids.append(c.item_id)
        docs.append(c.document_id)
        ranks.append(rank)
        rows.append(row_of[c.key])
    if not tables:
        return None
    return {"op": operation, "ch": channel,
            "model": (report.model or f"fused order: {report.note}")[:500],
            "model_id": model_id, "fv": FEATURE_VERSION,
            "qh": hashlib.sha256(question.encode()).digest(), "receipt": receipt_id,
            "tables": tables, "ids": ids, "docs": docs, "ranks": ranks, "fc": len(FEATURES),
            "features": report.features[rows], "ledger_op": f"{operation}.served",
            "served_tables": [t for t, _ in served], "served_ids": [i for _, i in served]}


_WRITE_USAGE = text(
    "with event as ("
    "  insert into memory.rank_events (operation, channel, model, model_id, feature_version,"
    "      question_hash, receipt_id, item_tables, item_ids, document_ids, served_ranks,"
    "      feature_count, features)"
    "  values (:op, :ch, :model, :model_id, :fv, :qh, :receipt, cast(:tables as text[]),"
    "      cast(:ids as uuid[]), cast(:docs as uuid[]), cast(:ranks as integer[]), :fc,"
    "      cast(:features as real[]))"
    "  returning id),"
    "ledger as ("
    "  insert into memory.usage_ledger (operation, channel, item_table, item_id)"
    "  select :ledger_op, :ch, s.t, s.i"
    "    from unnest(cast(:served_tables as text[]), cast(:served_ids as uuid[])) as s(t, i))"
    "select id from event")


def write_usage(session: Session, params: dict[str, Any]) -> uuid.UUID:
    """One ``rank_events`` row and the ledger's served rows, in one statement."""
    # The feature matrix as one real[] literal (a missing value, NaN, is NULL there): psycopg
    # would adapt a list of ~1,000 floats element by element, 1.7 ms against 0.5.
    flat = "{" + ",".join(map(repr, params["features"].reshape(-1).tolist())).replace(
        "nan", "NULL") + "}"
    event_id: uuid.UUID = session.execute(_WRITE_USAGE, {**params, "features": flat}).scalar_one()
    return event_id


def record_usage(session: Session, *, operation: str, channel: str, question: str,
                 report: RankReport, served: Sequence[tuple[str, uuid.UUID]],
                 pooled: Sequence[Any], model_id: uuid.UUID | None, receipt_id: uuid.UUID | None,
                 pooled_limit: int) -> uuid.UUID | None:
    """``usage_params`` written now, in ``session``'s transaction; returns the event's id."""
    params = usage_params(operation=operation, channel=channel, question=question, report=report,
                          served=served, pooled=pooled, model_id=model_id, receipt_id=receipt_id,
                          pooled_limit=pooled_limit)
    return None if params is None else write_usage(session, params)


# --- 3. training ---------------------------------------------------------------------------


@dataclass
class TrainingSet:
    matrix: np.ndarray[Any, Any]
    labels: np.ndarray[Any, Any]
    positions: np.ndarray[Any, Any]
    groups: list[int]
    events: int = 0
    skipped: int = 0  # events without any positive (nothing to learn from them)
    other_features: int = 0  # events recorded by another feature list (an older version)

    @property
    def positives(self) -> int:
        return int(self.labels.sum())


def training_set(rows: Sequence[Any]) -> TrainingSet:
    """Rows of ``memory.rank_training_rows`` as LambdaRank groups (events with a positive)."""
    mats: list[np.ndarray[Any, Any]] = []
    labels: list[np.ndarray[Any, Any]] = []
    positions: list[np.ndarray[Any, Any]] = []
    groups: list[int] = []
    skipped = other = 0
    width = len(FEATURES)
    for r in rows:
        if r.feature_count != width:
            other += 1
            continue
        used = np.array(r.used, dtype=np.float64)
        if used.sum() == 0:
            skipped += 1
            continue
        feats = np.array([np.nan if v is None else v for v in r.features], dtype=np.float32)
        ranks = np.array(r.served_ranks, dtype=np.int64)
        served_max = int(ranks.max()) if len(ranks) else 0
        mats.append(feats.reshape(len(used), width))
        labels.append(used)
        # 0-based positions for LightGBM; every pooled-not-served row shares one past the end.
        positions.append(np.where(ranks > 0, ranks - 1, served_max))
        groups.append(len(used))
    if not groups:
        empty = np.zeros((0, width), dtype=np.float32)
        return TrainingSet(empty, np.zeros(0), np.zeros(0, dtype=np.int64), [], 0, skipped, other)
    return TrainingSet(np.concatenate(mats), np.concatenate(labels), np.concatenate(positions),
                       groups, len(groups), skipped, other)


def ndcg_at(scores: np.ndarray[Any, Any], labels: np.ndarray[Any, Any], groups: Sequence[int],
            k: int = 10) -> float:
    """Mean nDCG@k over groups (binary gains); ties in score keep the stored order."""
    out = []
    start = 0
    for g in groups:
        s, y = scores[start:start + g], labels[start:start + g]
        start += g
        if y.sum() == 0:
            continue
        order = np.argsort(-s, kind="stable")[:k]
        dcg = sum(1.0 / math.log2(i + 2) for i, j in enumerate(order) if y[j] > 0)
        ideal = sum(1.0 / math.log2(i + 2) for i in range(min(int(y.sum()), k)))
        out.append(dcg / ideal)
    return float(np.mean(out)) if out else float("nan")


def _slice(ts: TrainingSet, first: int, last: int) -> TrainingSet:
    starts = np.cumsum([0, *ts.groups])
    a, b = int(starts[first]), int(starts[last])
    return TrainingSet(ts.matrix[a:b], ts.labels[a:b], ts.positions[a:b], ts.groups[first:last],
                       last - first)


@dataclass
class TrainReport:
    org: str
    events: int = 0
    skipped: int = 0
    other_features: int = 0
    training_rows: int = 0
    positives: int = 0
    held_back: int = 0
    figures: dict[str, float] = field(default_factory=dict)  # name -> held-back nDCG@10
    version: int | None = None
    activated: bool = False
    reason: str = ""

    def lines(self) -> list[str]:
        out = [f"tenant {self.org}: {self.events} event(s) with feedback "
               f"({self.skipped} without any used item skipped"
               + (f"; {self.other_features} recorded with another feature list "
                  f"(not {FEATURE_VERSION}) skipped" if self.other_features else "")
               + f"), {self.training_rows} training "
               f"row(s), {self.positives} positive(s); {self.held_back} newest held back",
               f"position bias: {POSITION_BIAS}"]
        if self.figures:
            out.append("held-back nDCG@10:  " + "  ".join(
                f"{name} {value:.3f}" for name, value in self.figures.items()))
        if self.version is not None:
            out.append(f"stored model v{self.version}: "
                       + ("activated" if self.activated else "not activated"))
        out.append(self.reason)
        return out


def train_tenant(session: Session, org: str, settings: Settings, *, since: datetime | None = None,
                 activate: str = "if-better", rounds: int | None = None) -> TrainReport:
    """Train, evaluate on the held-back newest events, store, and maybe activate (see module)."""
    if activate not in ("if-better", "never", "always"):
        raise BadInput(f"activate must be if-better, never or always, not {activate!r}")
    if not session.execute(select(func.auth.is_service())).scalar():
        raise BadInput("training reads every user's feedback: run it as the derive service identity")
    report = TrainReport(org)
    window = timedelta(seconds=settings.rank_label_window_s)
    rows = session.execute(text("select * from memory.rank_training_rows(:since, :window)"),
                           {"since": since, "window": window}).all()
    ts = training_set(rows)
    report.events, report.skipped, report.other_features = ts.events, ts.skipped, ts.other_features
    if ts.events < max(settings.rank_min_events, 2):
        report.reason = (f"not trained: {ts.events} event(s) with feedback; at least "
                         f"{settings.rank_min_events} needed (rank_min_events)")
        return report
    held = max(1, round(ts.events * settings.rank_holdout_share))
    fit, test = _slice(ts, 0, ts.events - held), _slice(ts, ts.events - held, ts.events)
    report.training_rows, report.positives, report.held_back = len(fit.labels), fit.positives, held
    artifact = train(fit.matrix, fit.labels, fit.groups, positions=fit.positions,
                     rounds=rounds or 100)
    card = model_card(version="pending", text=artifact,
                      trained_on={"tenant": org, "events": fit.events, "rows": len(fit.labels)},
                      params={"rounds": rounds or 100}, metrics={}, position_bias=POSITION_BIAS,
                      kinds=fit.matrix[:, FEATURES.index("kind")])
    new = model_from_text(artifact, card, name="tenant")
    rrf = FEATURES.index("rrf")
    report.figures["new"] = ndcg_at(new.score(test.matrix), test.labels, test.groups)
    report.figures["fused"] = ndcg_at(test.matrix[:, rrf].astype(np.float64), test.labels, test.groups)
    current = session.execute(select(StoredRankModel).where(StoredRankModel.active)).scalar_one_or_none()
    active: RankModel | str = default_model()
    active_name = "default"
    if current is not None:
        try:
            active = model_from_text(current.artifact, dict(current.card), name="tenant")
            active_name = f"active v{current.version}"
        except ModelRefused as exc:
            active = str(exc)
    if isinstance(active, RankModel):
        report.figures[active_name] = ndcg_at(active.score(test.matrix), test.labels, test.groups)
    baseline = report.figures.get(active_name, report.figures["fused"])
    better = report.figures["new"] > baseline
    last = session.execute(select(func.coalesce(func.max(StoredRankModel.version), 0))).scalar_one()
    version = int(last) + 1
    card.update(version=f"v{version}", metrics={k: round(v, 4) for k, v in report.figures.items()},
                held_back_events=held)
    do_activate = activate == "always" or (activate == "if-better" and better)
    if do_activate:
        session.execute(update(StoredRankModel).where(StoredRankModel.active)
                        .values(active=False, activated_at=None))
    session.add(StoredRankModel(
        version=version, artifact=artifact, sha256=bytes.fromhex(card["sha256"]),
        feature_version=FEATURE_VERSION, card=card, events=fit.events, training_rows=len(fit.labels),
        positives=fit.positives, position_bias=POSITION_BIAS, active=do_activate,
        activated_at=datetime.now(UTC) if do_activate else None))
    session.flush()
    report.version, report.activated = version, do_activate
    versus = f"{report.figures['new']:.3f} vs {active_name} {baseline:.3f}"
    report.reason = (f"activated: {versus}" if do_activate and better else
                     f"activated on request: {versus}" if do_activate else
                     f"kept the {active_name} model: {versus}")
    return report


@dataclass
class StatusReport:
    models: list[dict[str, Any]]
    events: int
    default: str


def status(session: Session) -> StatusReport:
    """The tenant's models (newest first), the caller's event count, and the default model."""
    models = [{"version": m.version, "active": m.active, "trained_at": m.trained_at,
               "events": m.events, "rows": m.training_rows, "positives": m.positives,
               "metrics": (m.card or {}).get("metrics", {}), "sha256": m.sha256.hex()[:12],
               "trained_by": m.trained_by}
              for m in session.execute(select(StoredRankModel)
                                       .order_by(StoredRankModel.version.desc())).scalars()]
    events = int(session.execute(text("select count(*) from memory.rank_training_rows(null, "
                                      "interval '1 second')")).scalar_one())
    d = default_model()
    default = d.label if isinstance(d, RankModel) else d
    return StatusReport(models, events, default)


def activate_version(session: Session, version: int) -> None:
    """Make stored model ``version`` the active one (the service identity only)."""
    found = session.execute(select(StoredRankModel.id).where(StoredRankModel.version == version)).scalar()
    if found is None:
        raise NotFound(f"no ranking model v{version} in this tenant")
    session.execute(update(StoredRankModel).where(StoredRankModel.active)
                    .values(active=False, activated_at=None))
    session.execute(update(StoredRankModel).where(StoredRankModel.id == found)
                    .values(active=True, activated_at=func.now()))
