"""Resident memory of process trees from Linux /proc, sampled on a background thread during the measured rounds.

For soak tests ("resident memory flat ±10% over ten minutes"): VmRSS summed over the watched processes and all their
descendants. Shared pages count once per process, which overstates the total but leaves a trend readable."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
MIB = 1024 * 1024


@dataclass(frozen=True)
class RssSample:
    seconds: float  # since the watch started
    bytes: int
    processes: int  # processes whose VmRSS was read; 0 once every watched process is gone


def is_running(pid: int) -> bool:
    """Whether /proc lists this process (so also False where there is no /proc)."""
    return (PROC / str(pid) / "stat").exists()


def resident_bytes(pid: int) -> int | None:
    """VmRSS of one process in bytes; None when it is gone or has no memory of its own (kernel thread, zombie)."""
    try:
        status = (PROC / str(pid) / "status").read_text()
    except OSError:  # gone before or while reading: FileNotFoundError, ProcessLookupError
        return None
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # the kernel writes "kB" and means KiB
    return None


def parents() -> dict[int, int]:
    """pid → parent pid for every process in /proc; one that exits while /proc is being read is left out."""
    table: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid …": comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat.rpartition(")")[2].split()
        if len(fields) >= 2:
            table[int(entry.name)] = int(fields[1])
    return table


def process_tree(roots: Iterable[int], parent_of: Mapping[int, int]) -> set[int]:
    """The roots listed in `parent_of` and all their descendants, each once."""
    children: dict[int, list[int]] = {}
    for pid, parent in parent_of.items():
        children.setdefault(parent, []).append(pid)
    tree: set[int] = set()
    pending = [pid for pid in roots if pid in parent_of]
    while pending:
        pid = pending.pop()
        if pid not in tree:
            tree.add(pid)
            pending.extend(children.get(pid, []))
    return tree


def tree_resident_bytes(roots: Iterable[int]) -> dict[int, int]:
    """pid → VmRSS bytes over the live roots and their descendants; {} when every root is gone (no error)."""
    readings: dict[int, int] = {}
    for pid in process_tree(roots, parents()):
        size = resident_bytes(pid)
        if size is not None:
            readings[pid] = size
    return readings


class Watch:
    """Samples the trees' total RSS at start, every `interval` seconds after it, and once more at stop()."""

    def __init__(self, pids: Sequence[int], interval: float) -> None:
        self._pids = tuple(pids)
        self._interval = interval
        self._samples: list[RssSample] = []
        self._started = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-rss", daemon=True)

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> list[RssSample]:
        self._stopping.set()
        self._thread.join()
        self._sample()  # the end of the run, however far from the last tick
        return list(self._samples)

    def _run(self) -> None:
        ticks = 0
        while True:
            self._sample()
            ticks += 1
            # On a fixed grid from the start, so slow /proc reads do not make the samples drift.
            delay = self._started + ticks * self._interval - time.monotonic()
            if self._stopping.wait(max(delay, 0.0)):
                return

    def _sample(self) -> None:
        readings = tree_resident_bytes(self._pids)
        self._samples.append(RssSample(time.monotonic() - self._started, sum(readings.values()), len(readings)))


def summarize(samples: Sequence[RssSample], settle_seconds: float) -> dict[str, Any]:
    """The samples, first/last/min/max MiB, and the drift from a baseline: the first sample at or after
    `settle_seconds` (the first sample when the run is shorter).

    change_after_warmup = (last - baseline) / baseline; max_deviation = max |sample - baseline| / baseline over the
    samples from the baseline on; both None when the baseline is 0 bytes (nothing watched was alive)."""
    if not samples:
        raise ValueError("no RSS samples to summarize")
    settled = [sample for sample in samples if sample.seconds >= settle_seconds] or list(samples)
    baseline = settled[0]
    sizes = [sample.bytes for sample in samples]
    return {
        "samples": [
            {"seconds": round(sample.seconds, 3), "bytes": sample.bytes, "processes": sample.processes}
            for sample in samples
        ],
        "first_mib": _mib(sizes[0]),
        "last_mib": _mib(sizes[-1]),
        "min_mib": _mib(min(sizes)),
        "max_mib": _mib(max(sizes)),
        "baseline_seconds": round(baseline.seconds, 3),
        "baseline_mib": _mib(baseline.bytes),
        "change_after_warmup": _fraction(sizes[-1] - baseline.bytes, baseline.bytes),
        "max_deviation": _fraction(max(abs(sample.bytes - baseline.bytes) for sample in settled), baseline.bytes),
    }


def _mib(size: int) -> float:
    return round(size / MIB, 3)


def _fraction(change: int, baseline: int) -> float | None:
    return round(change / baseline, 4) if baseline else None
