"""The verified identity a request runs under.

An ``Identity`` is built only from a verified token (or, for local use, from the
CLI's own development key); it is never taken from a request argument. Write
implies read: a scope held for writing is also readable.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Identity:
    org_id: str
    user_id: str
    read_scopes: frozenset[str] = field(default_factory=frozenset)
    write_scopes: frozenset[str] = field(default_factory=frozenset)
    roles: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def of(cls, org_id: str, user_id: str, *, read: list[str] | tuple[str, ...] = (),
           write: list[str] | tuple[str, ...] = ()) -> Identity:
        return cls(org_id, user_id, frozenset(read), frozenset(write))

    @property
    def readable(self) -> frozenset[str]:
        return self.read_scopes | self.write_scopes
