"""Liveness and readiness of a process's long-running parts, and the back-off they retry with.

Order of work for a long-running loop (the embedding queue, the derive schedule,
extraction on ingest):

1. it registers a ``Component`` with the process's ``Health`` (``engram up`` shows
   them at ``/readyz``; ``engram worker run`` shows them in its log);
2. ``supervise`` runs the loop's body; the body returns only when ``stop`` is set;
3. when the body raises, the failure is classified: the database gone (a refused
   connection, an admin shutdown, a broken link: ``errors.is_unavailable``) makes
   the component ``reconnecting``; any other exception ``failing``; a ``permanent``
   one (e.g. a worker whose model is no longer the active one) ``dead``, and the
   loop ends;
4. otherwise the body runs again after a back-off that doubles from
   ``initial_s`` up to ``max_s`` (with jitter, so many workers do not reconnect in
   step), and the component reports ``ok`` as soon as the body says it works
   again; each change of state is logged once, not once per try.

A component is healthy only in state ``ok``; ``starting`` and ``off`` are not
failures but are not ready either, except that ``off`` (a part turned off by
configuration) never holds readiness back.

What ``/readyz`` shows (``to_json``) is not what the log says. ``/readyz`` answers
anyone, so a component's public line names no volume and no row: ``ok`` shows no
detail (the log says "the last drain embedded 40 rows"; how much a process embeds or
derives tells how much its tenants write), an outage shows the host-free reason
(``errors.describe_unavailable``), any other failure only the exception's type (its
message may quote a row the database refused; the log has it), ``dead`` our own
message for an ``EngramError`` and the type for anything else, ``off`` the setting
that turned the part off. ``last_ok_at`` is shown only while a part is not ``ok`` (while
it is, it moves with every drain: when some tenant wrote).
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from orchestrator.errors import EngramError, describe_unavailable, is_unavailable

log = logging.getLogger("engram.health")

STARTING, OK, RECONNECTING, FAILING, DEAD, OFF = ("starting", "ok", "reconnecting", "failing",
                                                  "dead", "off")


@dataclass
class Component:
    """One long-running part: its state, why, since when, and how often it failed in a row."""

    name: str
    state: str = STARTING
    detail: str = ""  # what the log says
    public: str = ""  # what /readyz shows (see the module docstring)
    since: datetime = field(default_factory=lambda: datetime.now(UTC))
    failures: int = 0
    last_ok_at: datetime | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _set(self, state: str, detail: str, public: str = "") -> str | None:
        """Record the state; returns the previous one when it changed (else None)."""
        with self._lock:
            before = self.state
            self.detail, self.public = detail, public
            if state == OK:
                self.last_ok_at = datetime.now(UTC)
            if state == before:
                return None
            self.state = state
            self.since = datetime.now(UTC)
            return before

    def ok(self, detail: str = "") -> None:
        with self._lock:
            failures, down_since = self.failures, self.since
            self.failures = 0
        before = self._set(OK, detail)
        if before in (RECONNECTING, FAILING):
            log.warning("%s: working again after %d failed tries (%.1f s)", self.name, failures,
                        (datetime.now(UTC) - down_since).total_seconds())
        elif before is not None:
            log.info("%s: %s", self.name, detail or "running")

    def working(self, detail: str) -> None:
        """Ok, doing ``detail`` now (a long drain's progress), which the caller logs itself:
        no line of its own, even when the state changes."""
        with self._lock:
            self.failures = 0
        self._set(OK, detail)

    def retrying(self, exc: BaseException, retry_in: float) -> None:
        unavailable = is_unavailable(exc)
        with self._lock:
            self.failures += 1
        why = describe_unavailable(exc) if unavailable else f"{type(exc).__name__}: {exc}"
        why = why.split("\n")[0][:300]
        shown = why if unavailable else f"{type(exc).__name__} (the process log says why)"
        state = RECONNECTING if unavailable else FAILING
        before = self._set(state, f"{why}; next try in {retry_in:.1f} s",
                           f"{shown}; next try in {retry_in:.1f} s")
        if before is not None:
            if unavailable:
                log.warning("%s: %s; reconnecting with back-off (next try in %.1f s)", self.name,
                            why, retry_in)
            else:
                log.error("%s failed; retrying with back-off (next try in %.1f s)", self.name,
                          retry_in, exc_info=exc)

    def dead(self, exc: BaseException | str) -> None:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        # Our own words are shown; anything else only by its type (see the module docstring).
        shown = why if isinstance(exc, str | EngramError) else \
            f"{type(exc).__name__} (the process log says why)"
        self._set(DEAD, why.split("\n")[0][:300], shown.split("\n")[0][:300])
        log.error("%s stopped: %s", self.name, why)

    def off(self, detail: str) -> None:
        self._set(OFF, detail, detail)

    @property
    def healthy(self) -> bool:
        return self.state in (OK, OFF)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            # While ok, when it last said so is when it last drained or ticked: a write's
            # time to anyone watching. Shown once it is not ok, when it tells something.
            last_ok = self.last_ok_at if self.state != OK else None
            return {"state": self.state, "detail": self.public, "since": self.since.isoformat(),
                    "failures": self.failures,
                    "last_ok_at": last_ok.isoformat() if last_ok else None}


class Health:
    """The components of one process, by name."""

    def __init__(self) -> None:
        self._components: dict[str, Component] = {}
        self._lock = threading.Lock()

    def component(self, name: str) -> Component:
        with self._lock:
            found = self._components.get(name)
            if found is None:
                found = self._components[name] = Component(name)
            return found

    def components(self) -> list[Component]:
        with self._lock:
            return list(self._components.values())


@dataclass
class Backoff:
    """Delays that double from ``initial_s`` up to ``max_s``, with +-20% jitter; ``reset`` on success."""

    initial_s: float = 0.5
    max_s: float = 30.0
    _next: float = 0.0

    def delay(self) -> float:
        base = self._next or self.initial_s
        self._next = min(self.max_s, base * 2)
        return min(self.max_s, base) * random.uniform(0.8, 1.2)  # noqa: S311 (jitter, not secrecy)

    def reset(self) -> None:
        self._next = 0.0


def supervise(component: Component, body: Callable[[], None], stop: threading.Event, *,
              backoff: Backoff | None = None,
              permanent: tuple[type[BaseException], ...] = ()) -> None:
    """Run ``body`` until ``stop`` is set, again after each failure, with back-off.

    ``body`` calls ``component.ok()`` once it works (after a reconnect too) and returns
    only when ``stop`` is set. An exception of a ``permanent`` type marks the component
    ``dead`` and is raised again: the caller decides what a dead part means.
    """
    backoff = backoff or Backoff()
    while not stop.is_set():
        started = datetime.now(UTC)
        try:
            body()
        except permanent as exc:
            component.dead(exc)
            raise
        except Exception as exc:
            if stop.is_set():
                return
            if component.last_ok_at is not None and component.last_ok_at >= started:
                backoff.reset()  # it worked in this run before failing: start the back-off afresh
            wait = backoff.delay()
            component.retrying(exc, wait)
            stop.wait(wait)
            continue
        if stop.is_set():
            return
        # A body that returns without being stopped ran out of work; run it again.
        backoff.reset()
