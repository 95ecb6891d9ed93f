"""Engram: a PostgreSQL-owned memory engine for AI agents.

The package is laid out by the stages data passes through: ``config``, ``db``,
``auth``, ``ingest``, ``worker``, ``recall``, ``derive``, ``audit``, ``api`` and
``cli``. Nothing here touches the database at import time.
"""

__version__ = "0.1.0"
