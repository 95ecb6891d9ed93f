"""Where models run: CUDA when present (half precision, bigger batches), else CPU.

``ENGRAM_DEVICE`` (``Settings.device``) overrides the choice. On the CPU, torch
defaults to one intra-op thread per core, and its OpenMP threads spin while
they wait. In the one-machine deployment PostgreSQL, the API and the worker
share the cores, and a worker holding all of them starves the rest and itself:
measured on 2 shared cores under load, one thread embedded single passages ten
times faster than two. So the worker takes half the cores this process may use
(at least one), one inter-op thread, and ``ENGRAM_TORCH_THREADS`` overrides.
"""

from __future__ import annotations

import contextlib
import os
import threading
from dataclasses import dataclass

from orchestrator.config import Settings
from orchestrator.errors import BadInput

_threads_lock = threading.Lock()
_threads_set = False


@dataclass(frozen=True)
class DeviceChoice:
    device: str  # "cpu", "cuda", "cuda:1"
    half: bool
    batch_multiplier: int
    reason: str

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")


def usable_cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def configure_threads(wanted: int | None = None) -> int:
    """Set torch's thread counts once per process; returns the intra-op count."""
    global _threads_set
    import torch

    n = wanted if wanted and wanted > 0 else max(1, usable_cpus() // 2)
    with _threads_lock:
        if not _threads_set:
            torch.set_num_threads(n)
            # Only settable before the first parallel op; someone may have run torch earlier.
            with contextlib.suppress(RuntimeError):
                torch.set_num_interop_threads(1)
            _threads_set = True
    return int(torch.get_num_threads())


def choose_device(settings: Settings) -> DeviceChoice:
    import torch

    wanted = (settings.device or "").strip().lower()
    if wanted:
        if wanted.startswith("cuda"):
            if not torch.cuda.is_available():
                raise BadInput(
                    f"ENGRAM_DEVICE={settings.device} asks for CUDA, but torch sees no CUDA device "
                    "(CPU-only build or no GPU); unset ENGRAM_DEVICE to use the CPU"
                )
            return DeviceChoice(wanted, True, 4, f"ENGRAM_DEVICE={settings.device}")
        if wanted != "cpu":
            raise BadInput(
                f"ENGRAM_DEVICE={settings.device!r} is not a device; use cpu or cuda[:N]")
        threads = configure_threads(settings.torch_threads)
        return DeviceChoice("cpu", False, 1, f"ENGRAM_DEVICE=cpu, {threads} torch threads")
    if torch.cuda.is_available():
        return DeviceChoice("cuda", True, 4, f"CUDA available ({torch.cuda.get_device_name(0)})")
    threads = configure_threads(settings.torch_threads)
    return DeviceChoice("cpu", False, 1,
                        f"no CUDA; CPU, {threads} torch threads of {usable_cpus()} cores")
