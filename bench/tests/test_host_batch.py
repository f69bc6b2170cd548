"""`bench/host_batch.py` (the shard's host work per batch outside the forward) as CI runs it, small: one JSON object
whose parts add up, and the whole batch in one forward pass. Times are printed, not asserted (shared cores)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "host_batch.py"


def test_the_host_batch_report_adds_up() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--requests", "3", "--questions", "2", "--state", "40", "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(report)
    assert report["reads"] == 6
    assert report["prompt_tokens"] == 3 * 2 * (10 + 40 + 18)
    assert report["forward_passes"] == 1
    assert 0 < report["forward_ms"] <= report["batch_ms"]
    assert report["host_ms"] >= 0 and report["host_us_per_read"] >= 0
    # The prefix cache stores each batch between its pass's launch and the collection of its scores (on a GPU, while
    # the device computes): that part of the host work is reported apart from the part the device waits for.
    assert 0 < report["in_flight_ms"] <= report["host_ms"] and report["waited_host_ms"] >= 0
    assert report["syncs"] is report["in_flight_syncs"] is report["launch_syncs"] is None  # counted on CUDA only
    assert report["device"] == "cpu"  # the GPU check reads it on its machine
