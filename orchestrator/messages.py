"""Words every read surface says the same way, in a module that imports nothing: the CLI
prints them without importing the recall package (about a second on a slow core)."""

# What a recall, a trace or a prepared bundle shows when no evidence is served.
NOTHING_FITS = "(no evidence fits; nothing visible matched or the budget is too small)"


def shown(stages: str | None, rendered: str) -> str:
    """What ``engram recall`` and ``engram trace`` print, and the MCP ``trace`` tool returns:
    a trace's stages (``Trace.format``, when there are any), then the rendered string."""
    text = rendered or NOTHING_FITS
    return text if stages is None else f"{stages}\n7. rendered\n{text}"
