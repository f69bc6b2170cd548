"""Resident memory from /proc: one process, a process tree, a dead pid, the background watch, and the drift math."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from decision_bench import rss
from decision_bench.rss import RssSample, summarize

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")

MIB = 1024 * 1024


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    child = subprocess.Popen(["sleep", "60"])
    try:
        _wait_asleep(child.pid)
        yield child
    finally:
        child.kill()
        child.wait()


def _wait_asleep(pid: int) -> None:
    """Until `sleep` has exec'd and is sleeping, the child is a changing copy of this interpreter."""
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        head, _, rest = Path(f"/proc/{pid}/stat").read_text().rpartition(")")
        if head.endswith("(sleep") and rest.split()[0] == "S":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not start sleeping")


def _own_vmrss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_resident_bytes_of_this_process() -> None:
    size = rss.resident_bytes(os.getpid())
    assert size is not None
    assert size > 1 * MIB
    assert size == pytest.approx(_own_vmrss(), rel=0.1)


def test_tree_holds_this_process_and_its_child(sleeper: subprocess.Popen[bytes]) -> None:
    assert rss.parents()[sleeper.pid] == os.getpid()
    readings = rss.tree_resident_bytes([os.getpid()])
    assert {os.getpid(), sleeper.pid} <= set(readings)
    assert all(size > 0 for size in readings.values())
    child = rss.resident_bytes(sleeper.pid)
    assert child is not None
    assert readings[sleeper.pid] == pytest.approx(child, rel=0.05)  # a sleeping `sleep` does not grow
    total = sum(readings.values())
    assert total >= readings[os.getpid()] + child
    assert total >= _own_vmrss() * 0.9
    # Watching the child alone sees only the child.
    assert set(rss.tree_resident_bytes([sleeper.pid])) == {sleeper.pid}


def test_dead_pid_reads_as_no_process() -> None:
    finished = subprocess.Popen(["true"])
    finished.wait()
    assert not rss.is_running(finished.pid)
    assert rss.resident_bytes(finished.pid) is None
    assert rss.tree_resident_bytes([finished.pid]) == {}


def test_process_tree_walks_descendants_once() -> None:
    parent_of = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 30: 99}
    assert rss.process_tree([10], parent_of) == {10, 11, 12, 13}
    assert rss.process_tree([10, 12, 404], parent_of) == {10, 11, 12, 13}
    assert rss.process_tree([404], parent_of) == set()


def test_watch_samples_in_the_background(sleeper: subprocess.Popen[bytes]) -> None:
    watch = rss.Watch([os.getpid()], interval=0.05)
    watch.start()
    time.sleep(0.3)
    samples = watch.stop()
    assert len(samples) >= 4  # start, a few ticks, stop
    assert samples[0].seconds < 0.05
    assert [sample.seconds for sample in samples] == sorted(sample.seconds for sample in samples)
    assert samples[-1].seconds >= 0.3
    assert all(sample.processes >= 2 and sample.bytes > MIB for sample in samples)


def _samples(*points: tuple[float, float]) -> list[RssSample]:
    return [RssSample(seconds, int(mib * MIB), 3) for seconds, mib in points]


def test_summary_measures_drift_from_the_first_settled_sample() -> None:
    summary = summarize(_samples((0, 50), (30, 90), (60, 100), (90, 120), (120, 95), (150, 110)), settle_seconds=60)
    assert summary["first_mib"] == 50.0
    assert summary["last_mib"] == 110.0
    assert summary["min_mib"] == 50.0
    assert summary["max_mib"] == 120.0
    assert summary["baseline_seconds"] == 60.0
    assert summary["baseline_mib"] == 100.0
    assert summary["change_after_warmup"] == 0.1
    assert summary["max_deviation"] == 0.2  # 120 vs 100; the 50 during settling does not count
    assert summary["samples"][1] == {"seconds": 30.0, "bytes": 90 * MIB, "processes": 3}
    assert len(summary["samples"]) == 6


def test_summary_of_a_run_shorter_than_settling_uses_the_first_sample() -> None:
    summary = summarize(_samples((0, 200), (5, 190), (10, 210)), settle_seconds=60)
    assert summary["baseline_seconds"] == 0.0
    assert summary["change_after_warmup"] == 0.05
    assert summary["max_deviation"] == 0.05


def test_summary_with_everything_gone_has_no_ratios() -> None:
    summary = summarize([RssSample(0.0, 0, 0), RssSample(5.0, 0, 0)], settle_seconds=0)
    assert summary["change_after_warmup"] is None
    assert summary["max_deviation"] is None
    with pytest.raises(ValueError):
        summarize([], settle_seconds=0)
