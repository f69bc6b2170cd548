"""Session fixtures of the whole-stack suite: one launcher serving the embedded SmolLM2 for every test that
only needs a server, a factory for extra launchers (auth, shutdown, bad models), and the transformers
reference the server's probabilities are compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from launchers import DEFAULT_MODEL_DIR, Launcher, start_launcher

HEALTH_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 120.0
SESSION_ARGS = ["--dtype", "float32", "--hostname", "127.0.0.1"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "last: run after every other test (heavy requests that could stall the shard)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
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
def server_url(session_launcher: Launcher) -> str:
    return session_launcher.url


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
