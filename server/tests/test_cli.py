"""The `decision-server` command as the launcher runs it: a subprocess, JSON logs, signals, exit codes."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from conftest import label_logprobs, read_request, socket_dir

from decision_server.layers import resolve_matmul
from decision_server.pb import decision_pb2, decision_pb2_grpc
from decision_server.serve import remove_stale_socket

COMMAND = [sys.executable, "-m", "decision_server.cli"]


def start_reader(stream: Any) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for line in stream:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def wait_for_message(lines: queue.Queue[str], message: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        record: dict[str, Any] = json.loads(line)  # every stderr line must be one JSON object
        seen.append(record)
        if record["message"] == message:
            return record
    raise AssertionError(f"no {message!r} log line within {timeout}s; saw {seen}")


def leave_stale_socket(path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.close()  # the socket file stays, as after a shard killed with SIGKILL
    assert path.exists()


def test_serve_answers_then_stops_cleanly_on_sigterm(tiny_qwen3_dir: Path) -> None:
    with socket_dir() as folder:
        uds = folder / "shard-0.sock"
        leave_stale_socket(uds)
        process = subprocess.Popen(
            [*COMMAND, "serve", str(tiny_qwen3_dir), "--uds-path", str(uds), "--read-mode", "naive", "--threads", "1"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
        try:
            lines = start_reader(process.stderr)
            ready = wait_for_message(lines, "ready", timeout=120)
            assert ready["uds_path"] == str(uds)
            assert (ready["engine"], ready["implementation"]) == ("naive", "decoder")
            assert ready["architecture"] == "Qwen3ForCausalLM"
            with grpc.insecure_channel(f"unix://{uds}") as channel:
                stub = decision_pb2_grpc.DecisionShardStub(channel)
                info = stub.Info(decision_pb2.InfoRequest(), timeout=30)
                # No --matmul: auto, reported as the mode it resolved to on this CPU.
                expected = ("naive", "float32", "cpu", resolve_matmul("auto"))
                assert (info.engine, info.dtype, info.device, info.matmul) == expected
                assert stub.Health(decision_pb2.HealthRequest(), timeout=30).probe != 0.0
                (result,) = stub.Read(read_request([(3, [9707, 11, 1879], [[0], [16, 17]])]), timeout=30).results
                assert result.id == 3 and len(label_logprobs(result)) == 2
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
            wait_for_message(lines, "stopped", timeout=5)
            assert not uds.exists()
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_serve_fails_loudly_on_a_missing_model() -> None:
    with socket_dir() as folder:
        finished = subprocess.run(
            [*COMMAND, "serve", str(folder / "no-such-model"), "--uds-path", str(folder / "s.sock")],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    assert finished.returncode == 1
    last = json.loads(finished.stderr.strip().splitlines()[-1])
    assert last["level"] == "ERROR"
    assert last["message"].startswith("serve failed:")
    assert "no-such-model is not a Hugging Face model folder (no config.json)" in last["message"]


def test_export_default_command_is_idempotent(smollm2_dir: Path) -> None:
    started = time.monotonic()
    finished = subprocess.run(
        [*COMMAND, "export-default", "--out", str(smollm2_dir)], capture_output=True, text=True, timeout=60
    )
    assert finished.returncode == 0, finished.stderr
    assert finished.stdout.strip() == str(smollm2_dir)
    assert "export already complete" in finished.stderr
    assert time.monotonic() - started < 30  # interpreter start-up only; a conversion takes far longer


def test_help_lists_every_command() -> None:
    finished = subprocess.run([*COMMAND, "--help"], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0
    for command in ("serve", "export-default", "export-gguf", "make-fixture"):
        assert command in finished.stdout


def test_only_sockets_are_removed_as_stale(tmp_path: Path) -> None:
    regular = tmp_path / "not-a-socket"
    regular.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a socket"):
        remove_stale_socket(regular)
    assert regular.read_text() == "keep me"
    remove_stale_socket(tmp_path / "absent.sock")  # nothing there: nothing to do


def test_idle_openmp_threads_sleep_unless_the_caller_chose() -> None:
    from decision_server.cli import quiet_idle_openmp_threads

    environ: dict[str, str] = {}
    quiet_idle_openmp_threads(environ)
    assert environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    quiet_idle_openmp_threads(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}


def test_the_command_line_sets_openmp_up_before_torch_loads() -> None:
    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: main() must run before anything imports torch.
    probe = "import sys, decision_server.cli; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
    # main() itself sets the policy: a serve that fails at once (no model) still leaves it in the environment.
    run_main = (
        "import os, decision_server.cli as cli; "
        "code = cli.main(['serve', '/nonexistent/model', '--uds-path', '/nonexistent/s']); "
        "print(code, os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    ran = subprocess.run([sys.executable, "-c", run_main], capture_output=True, text=True, check=True, env=env)
    assert ran.stdout.split() == ["1", "PASSIVE"]
