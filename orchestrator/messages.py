"""Words every read surface says the same way, in a module that imports nothing: the CLI
prints them without importing the recall package (about a second on a slow core)."""

def nothing_served(needed_tokens: int | None, budget_tokens: int | None = None) -> str:
    """Why a recall served nothing: ``needed_tokens`` is the answer's ``needed_tokens``
    (evidence matched and none fit; the budget that serves the first item), None when
    nothing visible matched."""
    if needed_tokens is None:
        return "(no evidence: nothing this identity may read matched the question)"
    within = "" if budget_tokens is None else f" within {budget_tokens} tokens"
    return (f"(no evidence fits{within}: evidence matched, and the first item needs a budget "
            f"of at least {needed_tokens} tokens)")


def shown(stages: str | None, rendered: str, why: str) -> str:
    """What ``engram recall`` and ``engram trace`` print, and the MCP ``trace`` tool returns:
    a trace's stages (``Trace.format``, when there are any), then the rendered string, or
    ``why`` (``nothing_served``) when it is empty."""
    text = rendered or why
    return text if stages is None else f"{stages}\n7. rendered\n{text}"


def near_duplicate(dropped: str, twin: str, similarity: float) -> str:
    """A duplicate the order dropped, as the text trace and the console's card say it."""
    return f"{dropped}: near-duplicate of {twin} ({similarity:.3f})"
