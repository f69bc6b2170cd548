"""The `jevcompat` conformance suite (spec 0.1) against the session server, and against a server with
`--api-key` (where its authentication checks run too): both must be rated conformant."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from collections.abc import Callable

from launchers import JEVCOMPAT_BINARY, Launcher

# Its 255-option case is a ~2,200-token prefill: about 20 s on two idle cores, several times that when the
# cores are shared, so each request gets more than jevcompat's default 120 s; the whole run is bounded too.
REQUEST_TIMEOUT_S = 300
RUN_TIMEOUT_S = 900


def run_jevcompat(server_url: str, tmp_path: Path, key: str | None = None) -> None:
    assert JEVCOMPAT_BINARY.exists(), f"{JEVCOMPAT_BINARY} is missing"
    report = tmp_path / "jevcompat.json"
    env = {**os.environ, "NO_COLOR": "1"}
    env.pop("TYPESAFE_API_KEY", None)
    env.pop("TYPESAFE_BASE_URL", None)
    try:
        run = subprocess.run(
            [str(JEVCOMPAT_BINARY), "test", server_url, "--timeout", str(REQUEST_TIMEOUT_S), "--json", str(report), "--evidence", "5"]
            + (["--key", key] if key else []),
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        raise AssertionError(f"jevcompat did not finish within {RUN_TIMEOUT_S} s\n{out}") from e
    output = run.stdout + ("\n--- stderr ---\n" + run.stderr if run.stderr.strip() else "")
    summary = [line for line in run.stdout.splitlines() if "spec 0.1" in line]
    print("\n".join(summary[-1:]) or output)
    assert run.returncode == 0, f"jevcompat exited {run.returncode} (0 = conformant)\n{output}"


def test_jevcompat_rates_the_server_conformant(server_url: str, tmp_path: Path) -> None:
    run_jevcompat(server_url, tmp_path)


def test_jevcompat_rates_the_server_with_an_api_key_conformant(launcher_factory: Callable[..., Launcher], tmp_path: Path) -> None:
    launcher = launcher_factory(["--dtype", "float32", "--hostname", "127.0.0.1", "--api-key", "jevcompat-secret"], name="keyed")
    launcher.wait_healthy(timeout_s=300)
    run_jevcompat(launcher.url, tmp_path, key="jevcompat-secret")
