"""The chain's canonical forms, in Python.

PostgreSQL computes every hash (``provenance.event_body`` and the chain
trigger); this module reproduces them from exported values so that an auditor
can recompute a chain outside the database. The forms (``docs/provenance.md``):

* a **row image** is ``to_jsonb(row)`` taken with timestamps in UTC, shortest
  exact floats, hex bytea and ISO intervals, written as PostgreSQL prints jsonb:
  object keys ordered by byte length and then bytewise, ``", "`` between
  members, ``": "`` after keys; its version is the SHA-256 of the UTF-8 text;
* an **event body** is the jsonb array ``[tenant, seq, recorded_at (UTC,
  microseconds, Z), table, row_id, operation, actor_user, actor_role,
  activity_id, row_hash hex]`` printed the same way; an event's hash is
  ``sha256(prev_hash || body)`` and the first ``prev_hash`` is 32 zero bytes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

GENESIS = bytes(32)


def _string(value: str) -> str:
    # PostgreSQL's escape_json: the short escapes, \u00XX for other control
    # characters, everything else (non-ASCII included) as is: json.dumps agrees.
    return json.dumps(value, ensure_ascii=False)


def jsonb_text(value: Any) -> str:
    """``value::jsonb::text`` as PostgreSQL prints it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int | Decimal):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(jsonb_text(v) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return "{" + ", ".join(f"{_string(k)}: {jsonb_text(value[k])}" for k in keys) + "}"
    raise TypeError(f"no jsonb form for {type(value).__name__}")


def row_version(image: dict[str, Any]) -> bytes:
    """SHA-256 of a canonical row image (the ``row_hash`` of its events)."""
    return hashlib.sha256(jsonb_text(image).encode()).digest()


def utc_text(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True)
class ChainEvent:
    tenant_id: uuid.UUID
    seq: int
    recorded_at: datetime
    table_name: str
    row_id: dict[str, Any]
    operation: str
    actor_user: str | None
    actor_role: str
    activity_id: uuid.UUID | None
    row_hash: bytes
    prev_hash: bytes
    hash: bytes

    def body(self) -> bytes:
        return jsonb_text([
            str(self.tenant_id), self.seq, utc_text(self.recorded_at), self.table_name, self.row_id,
            self.operation, self.actor_user, self.actor_role,
            str(self.activity_id) if self.activity_id else None, self.row_hash.hex(),
        ]).encode()

    def computed_hash(self) -> bytes:
        return hashlib.sha256(self.prev_hash + self.body()).digest()


@dataclass(frozen=True)
class OfflineBreak:
    seq: int
    problem: str
    expected: bytes | None = None
    found: bytes | None = None


def verify_offline(events: list[ChainEvent], *, prev: bytes = GENESIS,
                   first_seq: int = 1) -> OfflineBreak | None:
    """Recompute one tenant's chain from its events in order; the first broken link or None."""
    expected_seq = first_seq
    for ev in events:
        if ev.seq != expected_seq:
            return OfflineBreak(expected_seq, f"event {expected_seq} is missing (the next event is {ev.seq})")
        if ev.prev_hash != prev:
            return OfflineBreak(ev.seq, "prev_hash does not link to the previous event", prev, ev.prev_hash)
        calc = ev.computed_hash()
        if calc != ev.hash:
            return OfflineBreak(ev.seq, "content does not match the hash", calc, ev.hash)
        prev = ev.hash
        expected_seq += 1
    return None


def event_to_json(ev: ChainEvent) -> dict[str, Any]:
    """One event as a JSON object (``engram audit dump``), every field needed to recompute it."""
    return {
        "tenant_id": str(ev.tenant_id), "seq": ev.seq, "recorded_at": utc_text(ev.recorded_at),
        "table_name": ev.table_name, "row_id": ev.row_id, "operation": ev.operation,
        "actor_user": ev.actor_user, "actor_role": ev.actor_role,
        "activity_id": str(ev.activity_id) if ev.activity_id else None,
        "row_hash": ev.row_hash.hex(), "prev_hash": ev.prev_hash.hex(), "hash": ev.hash.hex(),
    }


def event_from_json(line: str) -> ChainEvent:
    """Parse a line of a dump; numbers in row ids stay exact (Decimal)."""
    obj = json.loads(line, parse_float=Decimal)
    return ChainEvent(
        uuid.UUID(obj["tenant_id"]), int(obj["seq"]),
        datetime.strptime(obj["recorded_at"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC),
        obj["table_name"], obj["row_id"], obj["operation"], obj["actor_user"], obj["actor_role"],
        uuid.UUID(obj["activity_id"]) if obj["activity_id"] else None,
        bytes.fromhex(obj["row_hash"]), bytes.fromhex(obj["prev_hash"]), bytes.fromhex(obj["hash"]))
