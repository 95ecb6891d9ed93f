"""The production files in docker/ are checked by linting what can be checked here.

No Docker engine runs on the development machines, so these tests parse the
compose file and Dockerfiles and check that what they refer to exists: build
contexts, COPY sources, commands of the ``engram`` CLI and ``ENGRAM_*`` settings.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from orchestrator.config import Settings

DOCKER = Path(__file__).resolve().parents[1] / "docker"


def _compose() -> dict:  # type: ignore[type-arg]
    data = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    assert isinstance(data, dict)
    return data


def test_compose_has_database_api_and_worker() -> None:
    services = _compose()["services"]
    assert {"postgres", "migrate", "api", "worker"} <= set(services)
    assert services["worker"]["command"][:3] == ["engram", "worker", "run"]
    assert services["migrate"]["command"] == ["engram", "db", "migrate"]


def test_build_contexts_and_dockerfiles_exist() -> None:
    for name, svc in _compose()["services"].items():
        build = svc.get("build")
        if not build:
            continue
        context = (DOCKER / build["context"]).resolve()
        dockerfile = context / build.get("dockerfile", "Dockerfile")
        assert dockerfile.is_file(), f"{name}: {dockerfile} is missing"
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from" not in line:
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src} not found"


def test_engram_environment_names_are_real_settings() -> None:
    fields = {f"ENGRAM_{name.upper()}" for name in Settings.model_fields}
    for name, svc in _compose()["services"].items():
        for var in (svc.get("environment") or {}):
            if var.startswith("ENGRAM_"):
                assert var in fields, f"{name}: {var} is not an Engram setting"


def test_postgres_image_brings_vectorchord() -> None:
    text = (DOCKER / "postgres.Dockerfile").read_text()
    assert re.search(r"^FROM .*vchord.*pg18", text, re.M)
    assert "shared_preload_libraries" in text and "vchord" in text
