"""Rendering a recall result into one prompt-ready string with ``templates/recall.j2``.

The template receives the question and the typed evidence only, so nothing a
lane or a score knows can reach the prompt. Autoescaping is off because the
output is plain text for a model, not HTML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from jinja2 import Environment, PackageLoader, StrictUndefined, Template

from orchestrator.inputs import CONTROL_CHARACTERS
from orchestrator.recall.result import Evidence

# Line breaks (and the other vertical or control characters) inside a field of an item's
# header: a title, path, author or scope description holding "\nshared in: exec" would
# otherwise print a line of the rendered string's own structure (the item's provenance,
# its scopes, a new item) that the writer made up.
_BREAKS = re.compile(r"\s*[\n\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]\s*|" + CONTROL_CHARACTERS)


def one_line(value: object) -> str:
    """``value`` as text on one line: each run of line breaks and controls is one space."""
    return _BREAKS.sub(" ", str(value)).strip()


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The recall templates (recall.j2, prepare.j2 and the item macro they share)."""
    # Plain text for a model, not HTML: escaping would corrupt the evidence.
    env = Environment(
        loader=PackageLoader("orchestrator.recall", "templates"),
        undefined=StrictUndefined,
        autoescape=False,  # noqa: S701
    )
    env.filters["line"] = one_line
    return env


@lru_cache(maxsize=1)
def _template() -> Template:
    return environment().get_template("recall.j2")


def render(question: str, evidence: Sequence[Evidence]) -> str:
    return _template().render(question=question, evidence=list(evidence))


class Prefixes:
    """``k -> render(question, evidence[:k])``, with each item rendered at most once.

    ``budget_cut`` renders several prefixes of one evidence list (the longest that fits);
    rendering each whole prefix again cost a few milliseconds of Jinja per recall. The
    template's body is its ``head`` macro followed by its ``entry`` macro for each item, so
    the prefix of ``k`` items is the head and the first ``k`` entries joined; the macros are
    the template's own, so the two cannot drift apart (a test compares them)."""

    def __init__(self, question: str, evidence: Sequence[Evidence]) -> None:
        module = _template().make_module({"question": question, "evidence": []})
        self._entry = getattr(module, "entry")  # noqa: B009
        self._head = str(getattr(module, "head")(question))  # noqa: B009
        self._evidence = evidence
        self._entries: list[str] = []

    def __call__(self, k: int) -> str:
        if k <= 0:
            return ""  # no evidence renders nothing
        while len(self._entries) < k:
            n = len(self._entries)
            self._entries.append(str(self._entry(n + 1, self._evidence[n])))
        return self._head + "".join(self._entries[:k])

    def then(self, k: int, item: Evidence) -> str:
        """The rendering of the first ``k`` items followed by ``item`` (``recall.excerpt``:
        the item the cut stopped at, cut to a part), the ``k`` rendered once as before."""
        return (self(k) if k > 0 else self._head) + str(self._entry(k + 1, item))


def render_prefixes(question: str, evidence: Sequence[Evidence]) -> Prefixes:
    """``Prefixes`` of ``evidence``: call it with ``k`` for the first ``k`` items' string."""
    return Prefixes(question, evidence)
