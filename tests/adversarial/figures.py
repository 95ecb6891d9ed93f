"""The figures each adversarial class reports (attempts, leaks, refusals...), printed at the end
of the run by ``conftest.pytest_terminal_summary`` so they can be copied into docs/security.md."""

from __future__ import annotations

from collections import Counter

FIGURES: dict[str, Counter[str]] = {}
SEED: list[int] = []


def record(cls: str, **counts: int) -> None:
    FIGURES.setdefault(cls, Counter()).update(counts)


def lines() -> list[str]:
    out = [f"seed {SEED[0]} (rerun with ENGRAM_ADVERSARIAL_SEED={SEED[0]})"] if SEED else []
    for cls in sorted(FIGURES):
        out.append(f"{cls}: " + ", ".join(f"{k} {v}" for k, v in FIGURES[cls].items()))
    return out
