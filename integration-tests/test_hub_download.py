"""`--model-id ORG/NAME` missing from the Hugging Face cache: the launcher downloads it from a fake Hub on 127.0.0.1
(HF_ENDPOINT), with progress on its output, and serves it; a second start, offline, finds it in the cache.
Offline (HF_HUB_OFFLINE=1) and for an unknown repository the launcher stops at once with an error naming it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx2
import pytest

from conftest import HEALTH_TIMEOUT_S
from fake_hub import COMMIT, serving
from launchers import Launcher, cache_dir

pytestmark = pytest.mark.local_only

# The smallest fixture that serves (LFM2-VL, 5 MB), plus files a server never loads, which must stay on the Hub.
FIXTURE = cache_dir() / "models" / "tiny-lfm2-vl"
QUESTION = {"state": "Refund not received", "questions": {"urgent": {"type": "noul", "instructions": "Urgent?"}}}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    if not (FIXTURE / "config.json").is_file():
        pytest.fail(f"{FIXTURE} is missing: run `make fixtures`")
    folder = tmp_path / "repo"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns(".decision-complete.json"))
    (folder / "consolidated.pth").write_bytes(b"the same weights in another format")
    (folder / "original").mkdir()
    (folder / "original" / "params.json").write_text("{}")
    return folder


def hub_env(endpoint: str, cache: Path, offline: bool = False) -> dict[str, str]:
    return {"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1" if offline else "0"}


def test_a_hub_model_is_downloaded_once_and_served(
    launcher_factory: Callable[..., Launcher], repo: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    with serving({"org/tiny": repo}) as hub:
        launcher = launcher_factory(["--model-id", "org/tiny"], name="hub", env_extra=hub_env(hub.url, cache))
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        snapshot = cache / "models--org--tiny" / "snapshots" / COMMIT
        fetched = sorted(p.name for p in snapshot.iterdir())
        assert fetched == sorted(p.name for p in repo.iterdir() if p.is_file() and p.suffix != ".pth"), fetched
        output = launcher.output()
        assert "downloading org/tiny@main" in output and "(100 %)" in output and "ETA" in output, output[-3000:]
        assert f"downloaded org/tiny@main into {snapshot}" in output
        models = httpx2.get(f"{launcher.url}/v1/models", timeout=30).json()
        assert "org/tiny" in str(models), models
        answer = httpx2.post(f"{launcher.url}/v1/systemone", json=QUESTION, timeout=120)
        assert answer.status_code == 200, answer.text
        assert 0.0 <= answer.json()["answers"]["urgent"]["noul"] <= 1.0
        # The downloaded model reads images: examples/image_input.py runs here (the suite's own model reads none).
        example = Path(__file__).resolve().parent.parent / "examples" / "image_input.py"
        image = subprocess.run(
            [sys.executable, str(example), "--url", launcher.url], capture_output=True, text=True, timeout=120
        )
        assert image.returncode == 0 and "damaged: P(true) = " in image.stdout, f"{image.stdout}\n{image.stderr}"
        launcher.stop(grace_s=20.0)

        # Cached: found offline, the Hub never asked (resolving is enough; loading it again would only cost time).
        hub.requests.clear()
        again = launcher_factory(["--model-id", "org/tiny"], name="cached", env_extra=hub_env(hub.url, cache, True))
        deadline = time.monotonic() + 60
        while "model resolved" not in again.output() and again.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "model resolved" in again.output() and str(snapshot) in again.output(), again.output_tail()
        assert hub.requests == [], "a cached model must not reach the Hub"
        assert "downloading" not in again.output()


def test_offline_or_unknown_the_launcher_stops_naming_the_repository(
    launcher_factory: Callable[..., Launcher], repo: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "hub"
    with serving({"org/tiny": repo}) as hub:
        offline = launcher_factory(["--model-id", "org/tiny"], name="offline", env_extra=hub_env(hub.url, cache, True))
        assert offline.wait_exit(60) not in (None, 0), offline.output_tail()
        assert "org/tiny@main: not in the Hugging Face cache" in offline.output(), offline.output_tail()
        assert "HF_HUB_OFFLINE=1 forbids downloading it" in offline.output()
        assert hub.requests == []

        absent = launcher_factory(["--model-id", "org/absent@v1"], name="absent", env_extra=hub_env(hub.url, cache))
        assert absent.wait_exit(120) not in (None, 0), absent.output_tail()
        assert "downloading org/absent@v1 failed" in absent.output(), absent.output_tail()
        assert f"org/absent: no such model on {hub.url}" in absent.output()
        assert "HTTP 404" in absent.output()
