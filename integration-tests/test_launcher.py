"""The launcher as an operator meets it: API-key authentication, a clean SIGTERM shutdown that leaves no
process and no socket behind, and a readable failure for a model folder it cannot serve.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx2
import pytest

from launchers import LAUNCHER_BINARY, Launcher, describe, start_launcher, still_running
from wire import REQUEST_ID_HEADER, error_detail

API_KEY = "s3cret-integration-key"
GRACE_S = 30
BODY = {"state": "Refund not received.", "questions": {"refund": {"type": "noul", "instructions": "Money back?"}}}
HEALTH_TIMEOUT_S = 300.0
BAD_MODEL_TIMEOUT_S = 180.0
MAX_BODY_BYTES = 65_536


@pytest.fixture(scope="module")
def auth_launcher(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launcher]:
    workdir = tmp_path_factory.mktemp("auth")
    launcher = start_launcher(
        workdir,
        [
            "--dtype",
            "float32",
            "--hostname",
            "127.0.0.1",
            "--api-key",
            API_KEY,
            "--shutdown-grace-secs",
            str(GRACE_S),
            # A router flag the launcher once refused: every router flag is a launcher flag now.
            "--max-body-bytes",
            str(MAX_BODY_BYTES),
        ],
        name="auth",
    )
    try:
        launcher.wait_healthy(HEALTH_TIMEOUT_S)
        yield launcher
    finally:
        launcher.stop(grace_s=GRACE_S + 20)


def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    return httpx2.post(f"{url}/v1/systemone", content=json.dumps(BODY), headers={"content-type": "application/json", **headers}, timeout=120.0)


@pytest.mark.parametrize(
    "headers",
    [{}, {"authorization": "Bearer wrong-key"}, {"authorization": f"Bearer {API_KEY}x"}, {"authorization": f"Bearer {API_KEY[:-1]}"}],
    ids=["no-key", "wrong-key", "key-with-suffix", "key-prefix"],
)
def test_systemone_refuses_a_missing_or_wrong_key(auth_launcher: Launcher, headers: dict[str, str]) -> None:
    r = _post(auth_launcher.url, headers)
    assert r.status_code == 401, f"headers {headers} → {r.status_code} {r.text[:500]}"
    assert r.headers.get(REQUEST_ID_HEADER)
    assert error_detail(r)["error_type"] == "authentication_error", r.text


def test_systemone_accepts_the_right_key(auth_launcher: Launcher) -> None:
    r = _post(auth_launcher.url, {"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 200, f"{r.status_code} {r.text[:500]}"
    assert 0 <= r.json()["answers"]["refund"]["noul"] <= 1


def test_models_requires_the_key_too(auth_launcher: Launcher) -> None:
    missing = httpx2.get(f"{auth_launcher.url}/v1/models", timeout=30.0)
    assert missing.status_code == 401, f"{missing.status_code} {missing.text[:500]}"
    assert error_detail(missing)["error_type"] == "authentication_error"
    wrong = httpx2.get(f"{auth_launcher.url}/v1/models", headers={"authorization": "Bearer nope"}, timeout=30.0)
    assert wrong.status_code == 401, f"{wrong.status_code} {wrong.text[:500]}"
    right = httpx2.get(f"{auth_launcher.url}/v1/models", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    assert right.status_code == 200, f"{right.status_code} {right.text[:500]}"
    assert right.json()["models"]


def test_the_key_is_not_on_child_command_lines_or_in_logs(auth_launcher: Launcher) -> None:
    tree = auth_launcher.remember_tree()
    assert tree, "the launcher has no children"
    leaks = [describe(pid) for pid in tree if API_KEY in describe(pid)]
    assert not leaks, f"the API key shows in `ps`: {leaks}"
    assert API_KEY not in auth_launcher.output(), "the API key was logged"


@pytest.mark.parametrize("path", ["/metrics", "/info", "/docs", "/api-doc/openapi.json"])
def test_operator_routes_need_the_key_and_health_does_not(auth_launcher: Launcher, path: str) -> None:
    missing = httpx2.get(f"{auth_launcher.url}{path}", timeout=30.0)
    assert missing.status_code == 401, f"{path}: {missing.status_code} {missing.text[:300]}"
    keyed = httpx2.get(f"{auth_launcher.url}{path}", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30.0)
    assert keyed.status_code == 200, f"{path}: {keyed.status_code} {keyed.text[:300]}"
    assert httpx2.get(f"{auth_launcher.url}/health", timeout=30.0).status_code == 200


def test_info_shows_the_model_folder_to_the_key_holder(auth_launcher: Launcher) -> None:
    info = httpx2.get(f"{auth_launcher.url}/info", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30.0).json()
    assert info["model_dir"].endswith("SmolLM2-135M-Instruct"), info


def test_a_router_flag_given_to_the_launcher_reaches_the_router(auth_launcher: Launcher) -> None:
    key = {"authorization": f"Bearer {API_KEY}"}
    info = httpx2.get(f"{auth_launcher.url}/info", headers=key, timeout=30.0).json()
    assert info["limits"]["max_body_bytes"] == MAX_BODY_BYTES, info
    # Not given: auto, one call at a time on a CPU shard (two on one GPU).
    assert info["limits"]["max_batches_at_shard"] == 1, info
    big = {**BODY, "state": "x" * MAX_BODY_BYTES}
    r = httpx2.post(
        f"{auth_launcher.url}/v1/systemone",
        content=json.dumps(big),
        headers={"content-type": "application/json", **key},
        timeout=120.0,
    )
    assert r.status_code == 413, r.text


def _in_flight(url: str) -> float:
    text = httpx2.get(f"{url}/metrics", headers={"authorization": f"Bearer {API_KEY}"}, timeout=30.0).text
    match = re.search(r"^decision_http_requests_in_flight ([0-9.e+]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sigterm_stops_everything_cleanly(auth_launcher: Launcher) -> None:
    """Runs last in this module: it shuts the module's launcher down."""
    tree = auth_launcher.remember_tree()
    commands = [describe(pid) for pid in tree]
    assert any("decision-router" in c for c in commands), f"no router among the children: {commands}"
    assert any("decision-server" in c or "decision_server" in c for c in commands), f"no shard among the children: {commands}"
    sockets_before = sorted(auth_launcher.uds_path.parent.glob(auth_launcher.uds_path.name + "*"))
    assert sockets_before, f"no shard socket at {auth_launcher.uds_path}-*"

    # A graceful drain: 20 requests in flight at SIGTERM are all answered, while new ones are refused 503 +
    # Retry-After and /ready turns 503 (draining), then the shard stops. (/health, liveness, stays 200 while draining:
    # test_fleet.py; here the shard is frozen, so it would answer 503 for that.)
    in_flight = 20
    body = {
        "state": "The customer was charged twice for one order and the refund has not arrived. " * 3,
        "questions": {f"q{i}": {"type": "noul", "instructions": f"Is point {i} raised?"} for i in range(2)},
    }
    answers: list[int] = []
    lock = threading.Lock()

    def send() -> None:
        r = httpx2.post(
            f"{auth_launcher.url}/v1/systemone",
            content=json.dumps(body),
            headers={"content-type": "application/json", "authorization": f"Bearer {API_KEY}"},
            timeout=120.0,
        )
        with lock:
            answers.append(r.status_code)

    # The shard is frozen while they are sent, so that all 20 are surely still in flight at the signal.
    shard = next(pid for pid in tree if "decision-server" in describe(pid) or "decision_server" in describe(pid))
    os.kill(shard, signal.SIGSTOP)
    try:
        senders = [threading.Thread(target=send) for _ in range(in_flight)]
        for sender in senders:
            sender.start()
        deadline = time.monotonic() + 60
        while _in_flight(auth_launcher.url) < in_flight and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_flight(auth_launcher.url) == in_flight, f"in flight: {_in_flight(auth_launcher.url)}; {answers}"
        started = time.monotonic()
        auth_launcher.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        refused = _post(auth_launcher.url, {"authorization": f"Bearer {API_KEY}"})
        ready = httpx2.get(f"{auth_launcher.url}/ready", timeout=30.0)
    finally:
        os.kill(shard, signal.SIGCONT)
    for sender in senders:
        sender.join(GRACE_S + 15)
    code = auth_launcher.wait_exit(GRACE_S + 15)
    elapsed = time.monotonic() - started
    print(f"drain: {answers.count(200)} of {in_flight} in-flight requests answered 200; stopped in {elapsed:.1f} s")
    assert answers == [200] * in_flight, f"in-flight requests at SIGTERM answered {answers}"
    assert refused.status_code == 503 and refused.headers.get("retry-after"), f"{refused.status_code} {refused.text}"
    assert error_detail(refused)["error_type"] == "draining", refused.text
    assert ready.status_code == 503 and ready.headers.get("retry-after"), f"{ready.status_code} {ready.text}"
    assert [r["reason"] for r in ready.json()["reasons"]] == ["draining"], ready.text
    assert code is not None, f"still running {GRACE_S + 15} s after SIGTERM\n{auth_launcher.output_tail()}"
    assert code == 0, f"exit code {code} after SIGTERM\n{auth_launcher.output_tail()}"
    assert elapsed <= GRACE_S + 5, f"took {elapsed:.1f} s to stop (grace {GRACE_S} s)"

    deadline = time.monotonic() + 5
    left = [pid for pid, start in tree.items() if still_running(pid, start)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid, start in tree.items() if still_running(pid, start)]
    assert not left, "processes left behind after the launcher exited:\n  " + "\n  ".join(describe(p) for p in left)

    sockets_after = sorted(auth_launcher.uds_path.parent.glob(auth_launcher.uds_path.name + "*"))
    assert not sockets_after, f"socket files left behind: {sockets_after}"
    assert not _port_open(auth_launcher.port), "the HTTP port still accepts connections"


# ---------------------------------------------------------------------------------------------------------------
# Model folders the launcher cannot serve: a non-zero exit with a message, in bounded time, nothing left behind.


def _expect_failure(launcher: Launcher, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and launcher.proc.poll() is None:
        launcher.remember_tree()
        time.sleep(0.2)
    code = launcher.proc.poll()
    output = launcher.output()
    assert code is not None, f"still running after {timeout_s:.0f} s with a bad model\n{launcher.output_tail()}"
    assert code != 0, f"exit code 0 with a bad model\n{output[-4000:]}"
    time.sleep(0.5)
    left = [pid for pid, start in launcher.known_tree.items() if still_running(pid, start)]
    assert not left, "processes left behind:\n  " + "\n  ".join(describe(p) for p in left)
    return output


def test_empty_model_folder_fails_with_a_message(launcher_factory: Callable[..., Launcher], tmp_path: Path) -> None:
    empty = tmp_path / "empty-model"
    empty.mkdir()
    launcher = launcher_factory(["--model-id", str(empty), "--hostname", "127.0.0.1"], name="empty")
    output = _expect_failure(launcher, 60.0)
    assert str(empty) in output and "config.json" in output, f"the message does not name the problem:\n{output[-4000:]}"


def test_missing_model_folder_fails_with_a_message(launcher_factory: Callable[..., Launcher], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    launcher = launcher_factory(["--model-id", str(missing), "--hostname", "127.0.0.1"], name="missing")
    output = _expect_failure(launcher, 60.0)
    assert str(missing) in output, f"the message does not name the folder:\n{output[-4000:]}"


def test_model_folder_without_weights_fails_with_a_message(launcher_factory: Callable[..., Launcher], tmp_path: Path) -> None:
    broken = tmp_path / "no-weights"
    broken.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "vocab_size": 49152,
        "max_position_embeddings": 2048,
    }
    (broken / "config.json").write_text(json.dumps(config))
    launcher = launcher_factory(
        ["--model-id", str(broken), "--hostname", "127.0.0.1", "--dtype", "float32"], name="broken"
    )
    output = _expect_failure(launcher, BAD_MODEL_TIMEOUT_S)
    lowered = output.lower()
    named = str(broken) in output and any(w in lowered for w in ("safetensors", "pytorch_model", "weights"))
    assert named, f"the message does not name the folder and the missing weights:\n{output[-4000:]}"


def test_the_launcher_takes_every_value_of_the_shard_option_flags() -> None:
    """The launcher declares the shard's option flags as enums; the shard's `choices` module is their source. Drift
    (the launcher once refused `--dtype float16`, which the shard takes) fails here."""
    from decision_server import choices

    out = subprocess.run(
        [str(LAUNCHER_BINARY), "--print-flags"], capture_output=True, check=True, timeout=30, env={"PATH": ""}
    ).stdout
    values = {flag["flag"]: tuple(flag["values"]) for flag in json.loads(out)}
    for flag, shard_values in choices.SERVE_CHOICES.items():
        assert values[flag] == shard_values, flag
