"""Every file in examples/ runs against the suite's server and prints what it promises."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local_only

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# What each example's output must hold.
EXPECTED = {
    "raw_http.py": ["request id: example-raw-http", "team: ", "urgent: P(true) = ", "tone: score "],
    "typesafe_client.py": ["request id: ", "team: ", "urgent: P(true) = ", "tone: score "],
    "openai_sdk.py": ["refund: P(true) = ", "team: {"],
    "async_client.py": ["4 decisions in "],
    "score_replay.py": ["decision: [", "replayed: [", "max difference: "],
    "batch_file.sh": ['"id": "t-1"', '"id": "t-2"', '"id": "t-3"', '"status": 200'],
}
# Run by another test, against a server whose model reads what they need.
ELSEWHERE = {"image_input.py": "test_hub_download.py (a model that reads images)"}


def test_every_example_is_tested() -> None:
    assert sorted([*EXPECTED, *ELSEWHERE]) == sorted(p.name for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs(name: str, server_url: str) -> None:
    script = EXAMPLES / name
    if name.endswith(".sh"):
        command = ["bash", str(script), server_url]
    else:
        command = [sys.executable, str(script), "--url", server_url]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    for expected in EXPECTED[name]:
        assert expected in done.stdout, f"{name}: {expected!r} missing from:\n{done.stdout}\n{done.stderr}"
    if name == "score_replay.py":
        difference = float(done.stdout.split("max difference:")[1].split()[0])
        assert difference < 1e-5, done.stdout
