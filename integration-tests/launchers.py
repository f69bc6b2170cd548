"""Starting, watching and stopping `decision-launcher` processes for the whole-stack tests.

Each launcher gets a free port, its own socket path and a log file; its process tree is read from /proc so
tests can prove that a shutdown leaves nothing behind.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx2

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
LAUNCHER_BINARY = VENV_BIN / "decision-launcher"
JEVCOMPAT_BINARY = VENV_BIN / "jevcompat"



@functools.cache
def launcher_env_vars() -> frozenset[str]:
    """Every env var the launcher reads a flag from, from its own CLI definition (`--print-flags`): a stray one
    in the caller's shell must not leak in."""
    if not LAUNCHER_BINARY.exists():
        raise AssertionError(f"{LAUNCHER_BINARY} is missing; run `make install` first")
    out = subprocess.run(
        [str(LAUNCHER_BINARY), "--print-flags"],
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    return frozenset(flag["env"] for flag in json.loads(out) if flag["env"])


def cache_dir() -> Path:
    configured = os.environ.get("DECISION_CACHE_DIR")
    if configured:
        return Path(configured)
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "decision-inference"


DEFAULT_MODEL_DIR = cache_dir() / "models" / "SmolLM2-135M-Instruct"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launcher_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    stray = launcher_env_vars()
    env = {k: v for k, v in os.environ.items() if k not in stray}
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_OFFLINE"] = "1"
    env["NO_COLOR"] = "1"
    # Shards run their layers eagerly unless a test asks for `--compile auto` (the serving default): compiling them
    # costs each shard start seconds, and the suite starts dozens. test_systemone's compile tests cover the default.
    env["COMPILE"] = "off"
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


# ---------------------------------------------------------------------------------------------------------------
# /proc reading: a process is identified by (pid, start time) so a recycled pid is never mistaken for ours.


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    after_comm = raw[raw.rindex(")") + 2 :].split()
    return after_comm  # [state, ppid, pgrp, session, ..., starttime at index 19]


def process_identity(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) of a live or zombie process, None when gone."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every child, grandchild, … of `root`, as pid → start time."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        ident = process_identity(int(entry.name))
        if ident is None:
            continue
        _state, ppid, start = ident
        children.setdefault(ppid, []).append(int(entry.name))
        starts[int(entry.name)] = start
    found: dict[int, int] = {}
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found[child] = starts[child]
                stack.append(child)
    return found


def still_running(pid: int, start: int) -> bool:
    """True while that very process exists and has not exited (a zombie has exited)."""
    ident = process_identity(pid)
    return ident is not None and ident[2] == start and ident[0] != "Z"


def describe(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid}: {cmd}"


# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Launcher:
    """One running `decision-launcher` and what it was started with."""

    proc: subprocess.Popen[bytes]
    port: int
    uds_path: Path
    log_path: Path
    args: list[str]
    _log_file: object = field(repr=False, default=None)
    known_tree: dict[int, int] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError as e:
            return f"<cannot read {self.log_path}: {e}>"

    def output_tail(self, chars: int = 6000) -> str:
        text = self.output()
        return text if len(text) <= chars else "…" + text[-chars:]

    def remember_tree(self) -> dict[int, int]:
        """Records the current children and grandchildren so a teardown can clean up after a faulty launcher."""
        if self.proc.poll() is None:
            self.known_tree.update(descendants(self.proc.pid))
        return dict(self.known_tree)

    def wait_healthy(self, timeout_s: float) -> None:
        """Polls GET /health until 200; fails with the launcher's output if it exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        last = "no answer yet"
        while time.monotonic() < deadline:
            code = self.proc.poll()
            if code is not None:
                raise AssertionError(
                    f"decision-launcher exited with {code} before /health answered 200\n"
                    f"args: {self.args}\n--- launcher output ---\n{self.output_tail()}"
                )
            try:
                r = httpx2.get(f"{self.url}/health", timeout=5.0)
                if r.status_code == 200:
                    self.remember_tree()
                    return
                last = f"{r.status_code} {r.text[:300]}"
            except httpx2.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            self.remember_tree()
            time.sleep(0.5)
        raise AssertionError(
            f"decision-launcher did not become healthy within {timeout_s:.0f} s (last /health: {last})\n"
            f"args: {self.args}\n--- launcher output ---\n{self.output_tail()}"
        )

    def wait_exit(self, timeout_s: float) -> int | None:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, timeout_s: float) -> int | None:
        """SIGTERM to the launcher alone (its job is to stop its children); returns its exit code or None."""
        if self.proc.poll() is None:
            self.remember_tree()
            self.proc.send_signal(signal.SIGTERM)
        return self.wait_exit(timeout_s)

    def kill_everything(self) -> None:
        """Last resort at teardown: SIGKILL whatever is left of the tree this launcher started."""
        tree = self.remember_tree()
        if self.proc.poll() is None:
            self.proc.kill()
            self.wait_exit(10)
        for pid, start in tree.items():
            if still_running(pid, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None

    def stop(self, grace_s: float = 30.0) -> int | None:
        code = self.terminate(grace_s)
        self.kill_everything()
        return code


def start_launcher(
    workdir: Path,
    args: list[str],
    *,
    name: str = "launcher",
    env_extra: dict[str, str] | None = None,
) -> Launcher:
    """Starts `decision-launcher ARGS --port P --uds-path WORKDIR/NAME.sock` with output to WORKDIR/NAME.log."""
    if not LAUNCHER_BINARY.exists():
        raise AssertionError(f"{LAUNCHER_BINARY} is missing; run `make install` first")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    uds_path = workdir / f"{name}.sock"
    log_path = workdir / f"{name}.log"
    full_args = [str(LAUNCHER_BINARY), *args, "--port", str(port), "--uds-path", str(uds_path)]
    log_file = open(log_path, "wb")  # noqa: SIM115 - kept open for the child's lifetime
    proc = subprocess.Popen(
        full_args,
        stdin=subprocess.DEVNULL,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env=launcher_env(env_extra),
        cwd=workdir,
        start_new_session=True,  # a Ctrl-C in the test terminal reaches pytest, not the launcher
    )
    return Launcher(proc=proc, port=port, uds_path=uds_path, log_path=log_path, args=full_args, _log_file=log_file)
