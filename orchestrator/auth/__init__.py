"""Identity: who is asking, in which tenant, with which read/write scopes."""

from orchestrator.auth.identity import Identity

__all__ = ["Identity"]
