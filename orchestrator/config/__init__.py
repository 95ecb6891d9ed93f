"""One settings object for the whole process."""

from orchestrator.config.settings import Settings, get_settings

__all__ = ["Settings", "get_settings"]
