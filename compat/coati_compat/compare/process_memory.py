"""Peak memory of a run per role: a thread that reads the proportional set size (PSS) of a process and all its
descendants (the local Ray cluster it started, its workers) every ``every_s`` seconds.

A process's role is its Ray title (``ray::ExperienceMakerHolderImpl.workingloop`` -> ``ExperienceMakerHolderImpl``;
``ray::IDLE`` -> ``idle workers``), ``driver`` for the root, ``ray services`` for the cluster's own processes. The
peak of a role is the largest PSS one of its processes reached; the total peak is the largest sum over the tree
at one sample. PSS shares each shared page among the processes that map it, so the sums do not count the shared
libraries of every worker again.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Optional

import psutil

logger = logging.getLogger(__name__)

MIB = 2 ** 20


def role_of(proc: psutil.Process, root_pid: int) -> str:
    """The role name of a process of the tree (see the module docstring)."""
    if proc.pid == root_pid:
        return "driver"
    try:
        cmdline = proc.cmdline() or [""]
    except (psutil.Error, OSError):
        return "ray services"
    title = cmdline[0]
    if any("default_worker.py" in part for part in cmdline[:3]):
        return "idle workers"  # a worker still starting, before Ray titles it
    if title.startswith("ray::"):
        name = title[len("ray::"):].split(".")[0].split(" ")[0].rpartition(":")[2]  # "maker0:Class" -> "Class"
        return "idle workers" if name == "IDLE" else name
    return "ray services"


def _pss(proc: psutil.Process) -> Optional[int]:
    try:
        info = proc.memory_full_info()
    except (psutil.Error, OSError):
        return None
    return getattr(info, "pss", None) or info.rss


class MemorySampler(threading.Thread):
    """Samples the tree of ``root_pid`` until `stop`; `peaks_mib` and `total_peak_mib` hold what it saw."""

    def __init__(self, root_pid: int, every_s: float = 1.0) -> None:
        super().__init__(daemon=True, name=f"memory-{root_pid}")
        self.root_pid, self.every_s = root_pid, every_s
        self.peaks_mib: Dict[str, float] = {}
        self.total_peak_mib = 0.0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        """One look at the tree."""
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        total = 0.0
        for proc in procs:
            pss = _pss(proc)
            if pss is None:
                continue
            mib = pss / MIB
            total += mib
            role = role_of(proc, self.root_pid)
            self.peaks_mib[role] = max(self.peaks_mib.get(role, 0.0), mib)
        self.total_peak_mib = max(self.total_peak_mib, total)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.every_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
