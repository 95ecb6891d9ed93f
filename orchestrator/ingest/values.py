"""Values every writer accepts the same way, whichever door they came in by (GraphQL, MCP,
the Python client, the CLI)."""

from __future__ import annotations

from datetime import datetime

from orchestrator.errors import BadInput


def timestamp(name: str, value: datetime | str | None) -> datetime | None:
    """A moment with a time zone, from a ``datetime`` or an ISO 8601 string; ``BadInput``
    naming ``name`` otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        given = value
        try:
            value = datetime.fromisoformat(given)
        except ValueError:
            raise BadInput(f"{name} {given[:100]!r} is not an ISO 8601 date or time") from None
    if not isinstance(value, datetime):
        raise BadInput(f"{name} must be a datetime or an ISO 8601 string")
    if value.tzinfo is None:
        raise BadInput(f"{name} {value.isoformat()} has no time zone")
    return value
