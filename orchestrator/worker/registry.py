"""The embedding model registry (``worker.embedding_models``) as the processes see it.

Exactly one model is active: the one whose vectors the embeddable tables hold.
Its ``generation`` rises on every activation (0080_model_generations), so
``ActiveModel.key`` names one model *and* one activation: what a recaller
compares with the generation its statement read, and what a cache of query
embeddings keys by. Reading it is one indexed single-row query; every role that
embeds or recalls may read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, text

from orchestrator.errors import EngramError


class ModelMismatch(EngramError):
    """The model a process embeds with is not the database's active embedding model, or a
    model change was refused."""

    code = "MODEL_MISMATCH"


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    dimension: int
    active: bool
    generation: int
    query_prefix: str = ""
    passage_prefix: str = ""

    @property
    def key(self) -> str:
        """One model and one activation of it, e.g. ``all-MiniLM-L6-v2@3``."""
        return f"{self.name}@{self.generation}"

    def describe(self) -> str:
        return f"{self.name} ({self.dimension}-d, generation {self.generation})"


ActiveModel = RegisteredModel

_COLUMNS = "name, dimension, active, generation, query_prefix, passage_prefix"


def _model(row: tuple[Any, ...]) -> RegisteredModel:
    return RegisteredModel(str(row[0]), int(row[1]), bool(row[2]), int(row[3]), str(row[4]),
                           str(row[5]))


def read_active(conn: Connection) -> ActiveModel:
    row = conn.execute(text(
        f"select {_COLUMNS} from worker.embedding_models where active")).first()
    if row is None:
        raise ModelMismatch("no embedding model is active in worker.embedding_models")
    return _model(tuple(row))


def read_model(conn: Connection, name: str) -> RegisteredModel | None:
    row = conn.execute(text(f"select {_COLUMNS} from worker.embedding_models where name = :n"),
                       {"n": name}).first()
    return None if row is None else _model(tuple(row))


def list_models(conn: Connection) -> list[RegisteredModel]:
    rows = conn.execute(text(f"select {_COLUMNS} from worker.embedding_models order by name"))
    return [_model(tuple(r)) for r in rows]
