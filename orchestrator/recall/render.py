"""Rendering a recall result into one prompt-ready string with ``templates/recall.j2``.

The template receives the question and the typed evidence only, so nothing a
lane or a score knows can reach the prompt. Autoescaping is off because the
output is plain text for a model, not HTML.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from jinja2 import Environment, PackageLoader, StrictUndefined, Template

from orchestrator.recall.result import Evidence


@lru_cache(maxsize=1)
def environment() -> Environment:
    """The recall templates (recall.j2, prepare.j2 and the item macro they share)."""
    # Plain text for a model, not HTML: escaping would corrupt the evidence.
    return Environment(
        loader=PackageLoader("orchestrator.recall", "templates"),
        undefined=StrictUndefined,
        autoescape=False,  # noqa: S701
    )


@lru_cache(maxsize=1)
def _template() -> Template:
    return environment().get_template("recall.j2")


def render(question: str, evidence: Sequence[Evidence]) -> str:
    return _template().render(question=question, evidence=list(evidence))
