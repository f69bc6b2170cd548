"""A decision server started for one client run (`decision-batch --launch`): `decision-launcher` on a free loopback
port with its own shard sockets, waited for until GET /health answers 200, stopped with SIGTERM (then SIGKILL) when
the run ends; its output goes to a log file whose tail is shown if it never becomes healthy."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LAUNCHER = "decision-launcher"
STOP_GRACE_S = 30.0


class LaunchError(Exception):
    """The server could not be started; the message has the reason and the launcher's last lines."""


def find_launcher() -> str:
    """The launcher beside this Python (a checkout's .venv/bin, where `make install` puts it), else on PATH."""
    beside = Path(sys.executable).parent / LAUNCHER
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(LAUNCHER)
    if found is None:
        raise LaunchError(f"{LAUNCHER} is neither beside {sys.executable} nor on PATH (run `make install`)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False


@contextmanager
def launched(args: list[str], log: Path, timeout_s: float, launcher: str | None = None) -> Iterator[str]:
    """Starts the launcher with `args` (plus its port and host), yields its URL once healthy, stops it at the end."""
    program = launcher or find_launcher()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [program, *args, "--hostname", "127.0.0.1", "--port", str(port)]
    sockets = None
    if not any(arg == "--uds-path" or arg.startswith("--uds-path=") for arg in args) and "UDS_PATH" not in os.environ:
        # Its own shard sockets: the default path is taken whenever another server runs on the machine.
        sockets = tempfile.TemporaryDirectory(prefix="decision-batch-")
        command += ["--uds-path", os.path.join(sockets.name, "shard")]
    with log.open("ab") as output:
        try:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT)
        except OSError as e:
            raise LaunchError(f"cannot start {program}: {e}") from e
    try:
        deadline = time.monotonic() + timeout_s
        while not _healthy(url):
            if process.poll() is not None:
                raise LaunchError(f"{program} exited with status {process.returncode}:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise LaunchError(f"{program} not healthy after {timeout_s:.0f} s:\n{_tail(log)}")
            time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if sockets is not None:
            sockets.cleanup()
