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

from decision_server import collector
from decision_server.cli import build_parser
from decision_server.layers import MATMUL_MODES
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
            [
                *COMMAND,
                "serve",
                str(tiny_qwen3_dir),
                "--uds-path",
                str(uds),
                "--read-mode",
                "naive",
                "--threads",
                "1",
                "--max-batch-prefill-tokens",
                "3072",
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "DECISION_CACHE_DIR": str(folder)},
        )
        try:
            lines = start_reader(process.stderr)
            # No --matmul: auto times the float32 GEMMs while loading and logs what it chose.
            timed = wait_for_message(lines, "matmul auto: timed the float32 GEMMs on this CPU", timeout=120)
            assert timed["exact_ms"] > 0 and timed["fast_ms"] > 0 and timed["split_ms"] > 0
            assert timed["matmul"] in MATMUL_MODES
            # The shard keeps the times in its cache directory's record (a first load: one probe, its own times).
            record = folder / "matmul-probes.json"
            assert (timed["record"], timed["probes"]) == (str(record), 1)
            ((key, kept),) = json.loads(record.read_text()).items()
            assert kept["probes"] == 1 and "| 1 threads |" in key, (key, kept)
            ready = wait_for_message(lines, "ready", timeout=120)
            assert ready["uds_path"] == str(uds)
            assert (ready["engine"], ready["implementation"]) == ("naive", "decoder")
            assert ready["architecture"] == "Qwen3ForCausalLM"
            assert ready["batch_token_budget"] == 3072
            # Loaded and warm, the heap is frozen (torch, transformers and the model: hundreds of thousands of
            # objects a full collection would walk again every few batches) and young collections come later.
            assert ready["frozen_objects"] > 100_000, ready["frozen_objects"]
            assert ready["gc_thresholds"][0] == collector.YOUNG_THRESHOLD
            with grpc.insecure_channel(f"unix://{uds}") as channel:
                stub = decision_pb2_grpc.DecisionShardStub(channel)
                info = stub.Info(decision_pb2.InfoRequest(), timeout=30)
                # Info reports the mode auto resolved to, never "auto".
                expected = ("naive", "float32", "cpu", timed["matmul"])
                assert (info.engine, info.dtype, info.device, info.matmul) == expected
                # The operator's budget, which the launcher gives the router too.
                assert (info.batch_token_budget, info.batch_budget_rule) == (3072, "--max-batch-prefill-tokens 3072")
                assert stub.Health(decision_pb2.HealthRequest(), timeout=30).probe != 0.0
                (result,) = stub.Read(read_request([(3, [9707, 11, 1879], [[0], [16, 17]])]), timeout=30).results
                assert result.id == 3 and len(label_logprobs(result)) == 2
            process.send_signal(signal.SIGTERM)
            wait_for_message(lines, "stopped", timeout=30)
            stopped = time.monotonic()
            assert process.wait(timeout=30) == 0
            # Once stopped the process leaves at once: an interpreter tearing torch down lingered 1.4-4.8 s, which
            # a launcher, a container's scale-down or a rolling update waited for.
            assert time.monotonic() - stopped < 1.0, time.monotonic() - stopped
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


def test_the_batch_budget_flag_takes_a_positive_token_count_or_stays_auto(capsys: pytest.CaptureFixture[str]) -> None:
    serve = ["serve", "/m", "--uds-path", "/tmp/s.sock"]
    assert build_parser().parse_args(serve).max_batch_prefill_tokens is None
    assert build_parser().parse_args([*serve, "--max-batch-prefill-tokens", "16384"]).max_batch_prefill_tokens == 16384
    for bad in ("0", "-5", "auto", "1.5"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*serve, f"--max-batch-prefill-tokens={bad}"])
        assert "expected a whole number of tokens, at least 1" in capsys.readouterr().err


def test_help_lists_every_command() -> None:
    finished = subprocess.run([*COMMAND, "--help"], capture_output=True, text=True, timeout=60)
    assert finished.returncode == 0
    for command in ("serve", "export-default", "download", "export-gguf", "make-fixture"):
        assert command in finished.stdout


def test_only_sockets_are_removed_as_stale(tmp_path: Path) -> None:
    regular = tmp_path / "not-a-socket"
    regular.write_text("keep me")
    with pytest.raises(FileExistsError, match="not a socket"):
        remove_stale_socket(regular)
    assert regular.read_text() == "keep me"
    remove_stale_socket(tmp_path / "absent.sock")  # nothing there: nothing to do


def test_a_socket_a_shard_still_listens_on_is_refused_and_a_stale_one_removed(tmp_path: Path) -> None:
    # Two launchers on one machine with the default --uds-path: the second shard replaced the first's socket, and both
    # routers read from it (found comparing a float32 and a bfloat16 server: every answer agreed to 3e-6).
    live = tmp_path / "live.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(live))
    listener.listen(1)
    try:
        with pytest.raises(FileExistsError, match=r"socket of a running shard.*--uds-path"):
            remove_stale_socket(live)
        assert live.exists()
    finally:
        listener.close()
    remove_stale_socket(live)  # closed: what a killed shard leaves behind
    assert not live.exists()


def fake_topology(root: Path, siblings: dict[int, str]) -> Path:
    """A sysfs cpu folder where cpu N's thread_siblings_list reads `siblings[N]`."""
    for cpu, text in siblings.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(text + "\n")
    return root


def test_cpu_siblings_reads_lists_and_ranges(tmp_path: Path) -> None:
    from decision_server.cli import cpu_siblings

    sysfs = fake_topology(tmp_path, {0: "0-1", 2: "2,6", 3: "3"})
    assert cpu_siblings(0, sysfs) == {0, 1}
    assert cpu_siblings(2, sysfs) == {2, 6}
    assert cpu_siblings(3, sysfs) == {3}
    assert cpu_siblings(9, sysfs) == {9}  # the system does not say: a core of its own


def test_openmp_workers_sleep_only_where_spinning_takes_a_cpu_from_other_work(tmp_path: Path) -> None:
    from decision_server.cli import openmp_should_sleep

    hyperthreads = fake_topology(tmp_path / "smt", {0: "0-1", 1: "0-1"})
    cores = fake_topology(tmp_path / "cores", {0: "0", 1: "1", 2: "2", 3: "3"})
    assert openmp_should_sleep({0, 1}, None, 1, hyperthreads)  # one core's two hyperthreads
    assert openmp_should_sleep({0, 1}, 2, 1, hyperthreads)
    assert not openmp_should_sleep({0}, None, 1, hyperthreads)  # pinned to one of them: no sibling to take
    assert not openmp_should_sleep({0, 1}, None, 1, cores)  # two cores
    assert not openmp_should_sleep({0, 1, 2, 3}, 2, 2, cores)  # two ranks of two threads on four cores
    assert openmp_should_sleep({0, 1, 2, 3}, 4, 2, cores)  # eight threads on four cores
    assert openmp_should_sleep({0, 1}, 3, 1, cores)


def test_the_wait_policy_is_left_to_a_caller_who_chose_one() -> None:
    from decision_server.cli import set_openmp_wait_policy

    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    set_openmp_wait_policy(chosen, threads=64, world_size=1)  # oversubscribed, yet the caller's choice stands
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}
    oversubscribed: dict[str, str] = {}
    set_openmp_wait_policy(oversubscribed, threads=4 * len(os.sched_getaffinity(0)), world_size=1)
    assert oversubscribed == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_the_command_line_sets_openmp_up_before_torch_loads() -> None:
    # OpenMP reads OMP_WAIT_POLICY once, when torch loads it: main() must run before anything imports torch.
    probe = "import sys, decision_server.cli; print('torch' in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"
    # main() itself sets the policy from its flags: a serve that fails at once (no model) with more threads than
    # CPUs still leaves PASSIVE in the environment; without --threads it follows this machine's topology.
    threads = 4 * len(os.sched_getaffinity(0))
    run_main = (
        "import os, decision_server.cli as cli; "
        f"code = cli.main(['serve', '/nonexistent/model', '--uds-path', '/nonexistent/s', '--threads', '{threads}']); "
        "print(code, os.environ.get('OMP_WAIT_POLICY'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    ran = subprocess.run([sys.executable, "-c", run_main], capture_output=True, text=True, check=True, env=env)
    assert ran.stdout.split() == ["1", "PASSIVE"]


def test_the_option_flags_take_the_choices_module_values_and_it_needs_no_torch() -> None:
    from decision_server import choices
    from decision_server.cli import build_parser

    parser = build_parser()
    (serve,) = [action for action in parser._subparsers._group_actions if action.dest == "command"]  # type: ignore[union-attr]
    by_flag = {a.option_strings[0]: a for a in serve.choices["serve"]._actions if a.option_strings}  # type: ignore[index]
    for flag, values in choices.SERVE_CHOICES.items():
        assert tuple(by_flag[flag].choices) == values, flag
        assert by_flag[flag].default == "auto", flag
    probe = "import sys, decision_server.choices; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
