"""The container target of the whole-stack suite: our own image (`make image`) started with testcontainers.

Nothing is pulled (the image is local) and there is no reaper container (it could not be pulled either); every
container and network carries LABEL, so a teardown, the next session and `make test-integration` remove leftovers by
label. They also carry this session's id, so that removing a crashed session's leftovers never hits a fixture of this
one that is already running (the fleet of test_fleet_containers.py starts beside the session's container).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# testcontainers reads these when it is imported: no Ryuk (it would be pulled), and talk to 127.0.0.1 through
# the published port (the bridge network's addresses are not reachable from tests on this kind of machine).
os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
os.environ.setdefault("TESTCONTAINERS_HOST_OVERRIDE", "127.0.0.1")
os.environ.setdefault("TESTCONTAINERS_CONNECTION_MODE", "docker_host")

import docker
import httpx2
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network

IMAGE = os.environ.get("DECISION_TEST_IMAGE", "decision-inference:latest")
# The local base both our image and the fleet test's nginx are built from (scripts/image.sh makes it).
BASE_IMAGE = os.environ.get("BASE_IMAGE", "local/debian:bookworm")
LABEL = "decision-inference.test"
SESSION_LABEL = "decision-inference.test-session"
SESSION_ID = uuid.uuid4().hex
LABELS = {LABEL: "1", SESSION_LABEL: SESSION_ID}
CONTAINER_PORT = 80


def image_present() -> bool:
    try:
        docker.from_env().images.get(IMAGE)
    except docker.errors.ImageNotFound:
        return False
    return True


def remove_leftovers() -> int:
    """Removes the containers and networks an earlier session labelled and left (a crash's); returns how many."""
    client = docker.from_env()
    leftovers = [
        container
        for container in client.containers.list(all=True, filters={"label": LABEL})
        if container.labels.get(SESSION_LABEL) != SESSION_ID
    ]
    for container in leftovers:
        container.remove(force=True)
    networks = [
        network
        for network in client.networks.list(filters={"label": LABEL})
        if network.attrs.get("Labels", {}).get(SESSION_LABEL) != SESSION_ID
    ]
    removed = 0
    for network in networks:
        try:
            network.remove()
            removed += 1
        except docker.errors.APIError:
            pass  # still used by a container that is not ours to remove
    return len(leftovers) + removed


@dataclass
class Container:
    """One started container of IMAGE, its published port on 127.0.0.1, and how to read and stop it."""

    inner: DockerContainer
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def wrapped(self) -> Any:
        return self.inner.get_wrapped_container()

    def logs(self) -> str:
        out, err = self.inner.get_logs()
        return (out + err).decode(errors="replace")

    def logs_tail(self, chars: int = 6000) -> str:
        text = self.logs()
        return text if len(text) <= chars else "…" + text[-chars:]

    def status(self) -> str:
        self.wrapped.reload()
        return str(self.wrapped.status)

    def exit_code(self) -> int | None:
        self.wrapped.reload()
        state = self.wrapped.attrs["State"]
        return None if state.get("Running") else int(state["ExitCode"])

    def finished_at(self) -> float:
        """When its main process exited, as a Unix time (docker's State.FinishedAt, in nanoseconds)."""
        self.wrapped.reload()
        stamp = self.wrapped.attrs["State"]["FinishedAt"]  # 2026-12-07T05:30:00.123456789Z
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        return datetime.fromisoformat(whole).replace(tzinfo=UTC).timestamp() + float(f"0.{fraction or 0}")

    def wait_exit(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                return code
            time.sleep(0.3)
        return None

    def wait_healthy(self, timeout_s: float) -> None:
        """Polls /health through the published port until 200; fails with the container's logs otherwise."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.exit_code()
            if code is not None:
                raise AssertionError(f"container exited with {code} before /health answered\n{self.logs_tail()}")
            try:
                r = httpx2.get(f"{self.url}/health", timeout=5.0)
                if r.status_code == 200:
                    return
                last = f"{r.status_code} {r.text[:300]}"
            except httpx2.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            time.sleep(0.5)
        raise AssertionError(f"container not healthy within {timeout_s:.0f} s (last: {last})\n{self.logs_tail()}")

    def docker_stop(self, timeout_s: int = 10) -> float:
        """`docker stop` as a user runs it (SIGTERM, then SIGKILL after timeout_s); returns seconds taken."""
        started = time.monotonic()
        subprocess.run(
            ["docker", "stop", "-t", str(timeout_s), self.inner.get_container_id()],
            check=True,
            capture_output=True,
            timeout=timeout_s + 30,
        )
        return time.monotonic() - started

    def remove(self) -> None:
        try:
            self.inner.stop(force=True)
        except docker.errors.NotFound:
            pass


def create_network() -> Network:
    """A user-defined bridge network with the suite's labels: its containers reach each other by alias (Docker's
    DNS), and nothing on it is published unless a container publishes a port."""
    return Network(docker_network_kw={"labels": LABELS}).create()


def start_container(
    args: list[str] | None = None,
    *,
    env: dict[str, str] | None = None,
    volumes: list[tuple[Path, str]] | None = None,
    publish: bool = True,
    image: str = IMAGE,
    network: Network | None = None,
    alias: str | None = None,
) -> Container:
    """`docker run IMAGE ARGS` with port 80 published on 127.0.0.1 (a free port) and the suite's labels; on `network`
    (a user-defined one: its containers find each other by `alias`) when given."""
    if image == IMAGE and not image_present():
        raise AssertionError(f"image {IMAGE} is missing: build it with `make image` (make test does)")
    inner = DockerContainer(image)
    if args:
        inner.with_command(args)
    for key, value in (env or {}).items():
        inner.with_env(key, value)
    for host, target in volumes or []:
        inner.with_volume_mapping(str(host), target, mode="ro")
    if publish:
        # Loopback only: the published port must not be reachable from other machines.
        inner.ports[f"{CONTAINER_PORT}/tcp"] = ("127.0.0.1", None)  # type: ignore[assignment]
    if network is not None:
        inner.with_network(network)
        if alias is not None:
            inner.with_network_aliases(alias)
    inner.with_kwargs(labels=LABELS)
    inner.start()
    port = 0
    if publish:
        port = int(inner.get_docker_client().port(inner.get_container_id(), CONTAINER_PORT))
    return Container(inner=inner, port=port)
