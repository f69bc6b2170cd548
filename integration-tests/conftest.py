"""Session fixtures of the whole-stack suite: one server of the embedded SmolLM2 for every test that only needs
a server, on two targets (the local launcher, and the image started as a container: tests taking `server_url`
run on both), a factory for extra launchers (auth, shutdown, bad models), and the transformers reference the
server's probabilities are compared with.

DECISION_TEST_TARGETS=local (or container) runs one target only; the default is both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import os

import httpx2
import pytest

import containers
from launchers import DEFAULT_MODEL_DIR, Launcher, start_launcher

HEALTH_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
# The suites compare answers with transformers' float32 read to 1e-5, the promise of `--matmul exact`. The default,
# auto, may run a faster mode that decides alike but moves probabilities by up to about 2e-5 (oneDNN's float32
# GEMM, or the bfloat16 split GEMM on AMX CPUs): test_systemone's test_matmul_auto_* checks that mode against these.
SESSION_ARGS = ["--dtype", "float32", "--matmul", "exact", "--hostname", "127.0.0.1"]
# The image listens on 0.0.0.0:80 inside its own network namespace; only the published port is on loopback.
CONTAINER_ARGS = ["--dtype", "float32", "--matmul", "exact"]
TARGETS = tuple(t for t in os.environ.get("DECISION_TEST_TARGETS", "local,container").split(",") if t)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: run after every other test (heavy requests that could stall the shard)")
    config.addinivalue_line(
        "markers",
        "local_only: runs on the local target only (heavy, and nothing in it depends on how the server was started)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The container target runs every route, both SDKs, the conformance suite and the refusals; the generated
    # request volume, the 255-option naive comparison and the tensor-parallel comparison run once, locally.
    deselected = [
        item
        for item in items
        if item.get_closest_marker("local_only") is not None
        and getattr(item, "callspec", None) is not None
        and item.callspec.params.get("server_url") == "container"
    ]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    # Stable partition: everything else first, heavy tests at the end, each group in collection order.
    items.sort(key=lambda item: item.get_closest_marker("last") is not None)


@pytest.fixture(scope="session")
def session_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Short paths: unix socket names are limited to about 100 bytes.
    return tmp_path_factory.mktemp("di")


@pytest.fixture(scope="session")
def _session_launcher(session_workdir: Path) -> Iterator[Launcher]:
    """Started, not yet waited for: the reference model loads while the server starts."""
    launcher = start_launcher(session_workdir, SESSION_ARGS, name="session")
    try:
        yield launcher
    finally:
        code = launcher.stop(grace_s=30.0)
        if code is None:
            print(f"session launcher ignored SIGTERM for 30 s; killed.\n{launcher.output_tail()}")


@pytest.fixture(scope="session")
def session_launcher(_session_launcher: Launcher) -> Launcher:
    _session_launcher.wait_healthy(HEALTH_TIMEOUT_S)
    return _session_launcher


@pytest.fixture(scope="session")
def session_container() -> Iterator[containers.Container]:
    """The image as users run it, with the session launcher's flags; removed even when tests fail."""
    containers.remove_leftovers()
    container = containers.start_container(CONTAINER_ARGS)
    try:
        container.wait_healthy(HEALTH_TIMEOUT_S)
        yield container
    finally:
        container.remove()


@pytest.fixture(scope="session", params=TARGETS)
def server_url(request: pytest.FixtureRequest) -> str:
    """Where the server under test listens: the local launcher or the container (tests run once per target)."""
    if request.param == "container":
        container: containers.Container = request.getfixturevalue("session_container")
        return container.url
    assert request.param == "local", f"unknown target {request.param!r} in DECISION_TEST_TARGETS"
    launcher: Launcher = request.getfixturevalue("session_launcher")
    return launcher.url


@pytest.fixture(scope="session")
def http(server_url: str) -> Iterator[httpx2.Client]:
    with httpx2.Client(base_url=server_url, timeout=REQUEST_TIMEOUT_S) as client:
        yield client


@pytest.fixture(scope="session")
def server_info(http: httpx2.Client) -> dict[str, Any]:
    r = http.get("/info")
    assert r.status_code == 200, r.text
    info = r.json()
    assert isinstance(info, dict)
    return info


@pytest.fixture(scope="session")
def reference(_session_launcher: Launcher) -> Any:
    """The transformers reference, loaded once (after the server was started so both load together)."""
    from reference import Reference

    assert DEFAULT_MODEL_DIR.joinpath("config.json").is_file(), (
        f"{DEFAULT_MODEL_DIR} is missing; the launcher exports it on first start, or run `make fixtures`"
    )
    return Reference(DEFAULT_MODEL_DIR)


@pytest.fixture
def launcher_factory(tmp_path: Path) -> Iterator[Callable[..., Launcher]]:
    """Starts extra launchers; whatever they leave running is killed after the test."""
    started: list[Launcher] = []

    def start(args: list[str], name: str = "extra", env_extra: dict[str, str] | None = None) -> Launcher:
        launcher = start_launcher(tmp_path, args, name=f"{name}{len(started)}", env_extra=env_extra)
        started.append(launcher)
        return launcher

    yield start
    for launcher in started:
        launcher.stop(grace_s=20.0)
