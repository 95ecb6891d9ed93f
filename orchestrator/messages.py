"""Words every read surface says the same way, in a module that imports nothing: the CLI
prints them without importing the recall package (about a second on a slow core)."""

# What a recall, a trace or a prepared bundle shows when no evidence is served.
NOTHING_FITS = "(no evidence fits; nothing visible matched or the budget is too small)"
