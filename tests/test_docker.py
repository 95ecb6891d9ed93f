"""The production files in docker/ are checked by linting what can be checked here.

No Docker engine runs on the development machines, so these tests parse the
compose files and Dockerfiles and cross-check them against the code: build
contexts and COPY sources exist; every command is a command of the ``engram``
CLI; every ``ENGRAM_*`` name is a real setting; the settings the compose files
give the API pass the production gate (and fail it without the env file); every
image is pinned to a version; every long-running service has a health check, and
the API's health check asks a route the app serves on the port it listens on.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from sqlalchemy import create_engine

from orchestrator.config import Settings
from orchestrator.config.production import check_production
from orchestrator.errors import Misconfigured

DOCKER = Path(__file__).resolve().parents[1] / "docker"
COMPOSE_FILES = ("compose.yaml", "compose.citus.yaml")
ENV_EXAMPLE = DOCKER / "engram.env.example"
# A tag that names a release: a dotted version (3.11.13, 13.0.3) or a dated build (20251001).
VERSION_TAG = re.compile(r"(\d+\.\d+(\.\d+)?|\d{8})")


def compose(name: str = "compose.yaml") -> dict[str, Any]:
    data = yaml.safe_load((DOCKER / name).read_text())
    assert isinstance(data, dict)
    return data


def _merge(base: Any, over: Any) -> Any:
    """Compose's merge of an override file: mappings merge key by key, the rest is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], over[k]) if k in base and k in over else over.get(k, base.get(k))
                for k in {**base, **over}}
    return over


def services(name: str = "compose.yaml") -> dict[str, dict[str, Any]]:
    """The services of ``name``; an override file (compose.citus.yaml) merged over compose.yaml,
    as ``docker compose -f compose.yaml -f <name>`` runs it."""
    data = compose(name)
    if name != "compose.yaml":
        data = _merge(compose(), data)
    result: dict[str, dict[str, Any]] = data["services"]
    return result


def dockerfile_of(svc: dict[str, Any]) -> Path | None:
    build = svc.get("build")
    if not build:
        return None
    return (DOCKER / build["context"]).resolve() / build.get("dockerfile", "Dockerfile")


def env_file_values(path: Path, *, commented: bool = False) -> dict[str, str]:
    """KEY=value lines of an env file; with ``commented``, also the ``# KEY=value`` examples."""
    values: dict[str, str] = {}
    pattern = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(.*)$")
    for line in path.read_text().splitlines():
        m = pattern.match(line.strip())
        if m and (commented or not m.group(1)):
            values[m.group(2)] = m.group(3)
    return values


SETTING_NAMES = {f"ENGRAM_{name.upper()}" for name in Settings.model_fields}


def cli_command(argv: list[str]) -> Any:
    """The (click) command ``argv`` (starting with ``engram``) runs; fails if there is none."""
    from orchestrator.cli.main import app

    assert argv[0] == "engram", argv
    command: Any = typer.main.get_command(app)
    for word in argv[1:]:
        if word.startswith("-") or not hasattr(command, "commands"):
            break
        sub = command.get_command(None, word)  # the CLI imports a command when asked for it
        assert sub is not None, f"`{' '.join(argv)}`: {word!r} is not an engram command"
        command = sub
    return command


# -- compose.yaml ---------------------------------------------------------------------------


def test_compose_has_database_api_and_worker() -> None:
    svc = services()
    assert {"postgres", "migrate", "api", "worker"} <= set(svc)
    assert svc["worker"]["command"][:3] == ["engram", "worker", "run"]
    assert svc["migrate"]["command"] == ["engram", "db", "migrate"]
    assert svc["api"]["command"][:2] == ["engram", "serve"]


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_build_contexts_and_dockerfiles_exist(name: str) -> None:
    for svc_name, svc in services(name).items():
        dockerfile = dockerfile_of(svc)
        if dockerfile is None:
            continue
        assert dockerfile.is_file(), f"{svc_name}: {dockerfile} is missing"
        context = dockerfile.parent if svc["build"]["context"] == "." else (
            DOCKER / svc["build"]["context"]).resolve()
        for line in dockerfile.read_text().splitlines():
            if line.startswith("COPY ") and "--from" not in line:
                for src in line.split()[1:-1]:
                    assert (context / src).exists(), f"{dockerfile.name}: COPY {src} not found"


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_command_is_an_engram_command(name: str) -> None:
    checked = 0
    for svc_name, svc in services(name).items():
        argvs = [svc.get("command")]
        test = (svc.get("healthcheck") or {}).get("test")
        if test and test[0] == "CMD":
            argvs.append(test[1:])
        for argv in argvs:
            if argv and argv[0] == "engram":
                command = cli_command(argv)
                # The options given are options of that command.
                known = {o for p in command.params for o in getattr(p, "opts", [])}
                for word in argv:
                    if word.startswith("--"):
                        assert word in known, f"{svc_name}: {word} is not an option of {argv}"
                checked += 1
    assert checked >= (3 if name == "compose.yaml" else 0)


def test_a_wrong_command_is_caught() -> None:
    with pytest.raises(AssertionError, match="not an engram command"):
        cli_command(["engram", "worker", "runn"])


def test_engram_environment_names_are_real_settings() -> None:
    names = set(compose()["x-engram-env"]) | set(env_file_values(ENV_EXAMPLE, commented=True))
    unknown = {n for n in names if n.startswith("ENGRAM_")} - SETTING_NAMES
    assert not unknown, f"not Engram settings: {sorted(unknown)}"
    assert {"ENGRAM_AUTH_ISSUER", "ENGRAM_AUTH_AUDIENCE", "ENGRAM_AUTH_JWKS_URL"} <= set(
        env_file_values(ENV_EXAMPLE))


def _api_settings(*, with_env_file: bool) -> Settings:
    """What the API container's settings would be: the compose environment (its ${...}
    interpolations given values) plus, if asked, the example env file."""
    values: dict[str, Any] = {}
    for name, value in compose()["x-engram-env"].items():
        values[name] = re.sub(r"\$\{[^}]+\}", "secret", str(value))
    if with_env_file:
        values.update(env_file_values(ENV_EXAMPLE))
    fields = {n.removeprefix("ENGRAM_").lower(): v for n, v in values.items()}
    return Settings(**fields)


def test_engram_services_run_in_production_with_the_env_file() -> None:
    for svc_name in ("migrate", "api", "worker"):
        svc = services()[svc_name]
        assert svc["environment"]["ENGRAM_ENV"] == "production", svc_name
        files = svc["env_file"]
        assert files == [{"path": "engram.env", "required": True}], svc_name
    assert (DOCKER.parent / ".gitignore").read_text().count("docker/engram.env") == 1


def test_the_example_env_file_passes_the_production_gate() -> None:
    settings = _api_settings(with_env_file=True)
    assert settings.env == "production" and settings.auth_issuer
    assert check_production(settings) == []
    from orchestrator.auth.devkey import dev_key_trusted

    assert not dev_key_trusted(settings)


def test_without_the_env_file_the_api_refuses_to_start() -> None:
    with pytest.raises(Misconfigured, match="ENGRAM_AUTH_ISSUER is not set"):
        check_production(_api_settings(with_env_file=False))


def _images() -> list[tuple[str, str]]:
    """(where, image reference) for every FROM and every compose ``image:``."""
    found: list[tuple[str, str]] = []
    for dockerfile in sorted(DOCKER.glob("*Dockerfile")):
        args = dict(re.findall(r"^ARG (\w+)=(\S+)", dockerfile.read_text(), re.M))
        for ref in re.findall(r"^FROM (\S+)", dockerfile.read_text(), re.M):
            for name, value in args.items():
                ref = ref.replace("${" + name + "}", value)
            found.append((dockerfile.name, ref))
    for name in COMPOSE_FILES:
        for svc_name, svc in services(name).items():
            if "image" in svc:
                found.append((f"{name}:{svc_name}", svc["image"]))
    return found


def test_every_image_is_pinned_to_a_version() -> None:
    images = _images()
    assert len(images) >= 3, images
    for where, ref in images:
        name, _, tag = ref.rpartition(":")
        assert name and "/" not in tag, f"{where}: {ref} names no tag"
        assert "latest" not in tag, f"{where}: {ref} floats ({tag})"
        assert VERSION_TAG.search(tag), f"{where}: {ref} is not pinned to a version"


def test_a_floating_image_is_caught() -> None:
    for ref in ("tensorchord/vchord-suite:pg18-latest", "python:slim", "citusdata/citus"):
        name, _, tag = ref.rpartition(":")
        assert not name or "latest" in tag or not VERSION_TAG.search(tag)


@pytest.mark.parametrize("name", COMPOSE_FILES)
def test_every_long_running_service_has_a_health_check(name: str) -> None:
    svc = services(name)
    for svc_name, s in svc.items():
        job = s.get("restart") == "no"
        if not job:
            assert s.get("healthcheck", {}).get("test"), f"{name}: {svc_name} has no health check"
        for dep, cond in (s.get("depends_on") or {}).items():
            condition = cond["condition"]
            if condition == "service_healthy":
                assert svc[dep].get("healthcheck"), f"{svc_name} waits for {dep}'s health check"
            elif condition == "service_completed_successfully":
                assert svc[dep].get("restart") == "no", f"{dep} is waited on as a job"


def _app_routes() -> set[str]:
    from orchestrator.api.app import create_app

    # Building the app connects to nothing; its route table is what uvicorn serves.
    engine = create_engine("postgresql+psycopg://nobody@127.0.0.1:1/nothing")
    try:
        app = create_app(Settings(), engine)
        return {getattr(r, "path", "") for r in app.routes}
    finally:
        engine.dispose()


def test_api_port_and_health_check_match_the_app() -> None:
    api = services()["api"]
    command = api["command"]
    port = command[command.index("--port") + 1]
    assert f"{port}:{port}" in api["ports"] or any(p.endswith(f":{port}") for p in api["ports"])
    dockerfile = dockerfile_of(api)
    assert dockerfile is not None
    assert re.search(rf"^EXPOSE {port}$", dockerfile.read_text(), re.M)
    probe = " ".join(api["healthcheck"]["test"])
    url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", probe)
    assert url, probe
    assert url.group(1) == port, "the health check asks the port the API listens on"
    routes = _app_routes()
    assert url.group(2) in routes, f"the API serves no {url.group(2)} (routes: {sorted(routes)})"


def test_dockerfile_default_command_is_the_api() -> None:
    api = services()["api"]
    dockerfile = dockerfile_of(api)
    assert dockerfile is not None
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile.read_text(), re.M)
    assert cmd and yaml.safe_load(cmd.group(1)) == api["command"]
    assert shlex.join(api["command"]).startswith("engram serve")


def test_postgres_image_brings_vectorchord() -> None:
    text = (DOCKER / "postgres.Dockerfile").read_text()
    assert re.search(r"^FROM .*vchord.*pg18", text, re.M), "PostgreSQL 18 (uuidv7) with vchord"
    assert "shared_preload_libraries" in text and "vchord" in text
