"""Where models run: CUDA when present (half precision, bigger batches), else CPU.

``ENGRAM_DEVICE`` (``Settings.device``) overrides the choice. On the CPU, torch
defaults to one intra-op thread per logical core and also spins inter-op
threads; on a small shared machine that oversubscribes, so the worker pins
intra-op threads to the cores this process may use and one inter-op thread.
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


def configure_threads() -> int:
    """Set torch's thread counts once per process; returns the intra-op count."""
    global _threads_set
    import torch

    n = usable_cpus()
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
        configure_threads()
        return DeviceChoice("cpu", False, 1, "ENGRAM_DEVICE=cpu")
    if torch.cuda.is_available():
        return DeviceChoice("cuda", True, 4, f"CUDA available ({torch.cuda.get_device_name(0)})")
    configure_threads()
    return DeviceChoice("cpu", False, 1, f"no CUDA; CPU with {usable_cpus()} threads")
