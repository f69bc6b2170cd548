"""`decision-server download` against a fake Hugging Face Hub served by the test on 127.0.0.1 (HF_ENDPOINT): only the
files a server loads, resumed after a cut, a revision, and the 404 / 401 / gated / offline refusals naming the repo."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from decision_server.hub import duration_text, needed_files, split_model_id

TOKEN = "hf_good"


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]]  # commit sha → files
    refs: dict[str, str]  # branch or tag → commit sha
    private: bool = False
    gated: bool = False


@dataclass
class Hub:
    repos: dict[str, Repo]
    cut_once: set[str] = field(default_factory=set)  # files whose first GET stops half way
    failing: set[str] = field(default_factory=set)  # files whose GET answers 500
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, Range
    lock: threading.Lock = field(default_factory=threading.Lock)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: Hub

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _refuse(self, status: int, code: str, head: bool) -> None:
        self._send(status, json.dumps({"error": code}).encode(), {"X-Error-Code": code}, head)

    def _repo(self, name: str, head: bool) -> Repo | None:
        repo = self.hub.repos.get(name)
        authorized = self.headers.get("authorization") == f"Bearer {TOKEN}"
        if repo is None or (repo.private and not authorized):
            self._refuse(404 if repo is None else 401, "RepoNotFound", head)
            return None
        if repo.gated and not authorized:
            self._refuse(403, "GatedRepo", head)
            return None
        return repo

    def _commit(self, repo: Repo, revision: str, head: bool) -> str | None:
        commit = revision if revision in repo.commits else repo.refs.get(revision)
        if commit is None:
            self._refuse(404, "RevisionNotFound", head)
        return commit

    def _serve(self, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("range")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo = self._repo("/".join(parts[2:4]), head)
            if repo is None or (commit := self._commit(repo, parts[5], head)) is None:
                return
            files = repo.commits[commit]
            if parts[4] == "revision":
                siblings = [
                    {"rfilename": name, "size": len(data), "blobId": git_oid(data)} for name, data in files.items()
                ]
                body = {
                    "id": "/".join(parts[2:4]),
                    "modelId": "/".join(parts[2:4]),
                    "sha": commit,
                    "siblings": siblings,
                }
            else:
                body = [
                    {"type": "file", "path": name, "size": len(data), "oid": git_oid(data)}
                    for name, data in files.items()
                ]
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"}, head)
            return
        if len(parts) >= 5 and parts[2] == "resolve":
            repo = self._repo("/".join(parts[:2]), head)
            if repo is None or (commit := self._commit(repo, parts[3], head)) is None:
                return
            name = "/".join(parts[4:])
            if name not in repo.commits[commit]:
                self._refuse(404, "EntryNotFound", head)
                return
            self._file(commit, name, repo.commits[commit][name], head)
            return
        self._send(404, b"no such route", head=head)

    def _file(self, commit: str, name: str, data: bytes, head: bool) -> None:
        headers = {"X-Repo-Commit": commit, "ETag": f'"{sha(data)}"', "Accept-Ranges": "bytes"}
        start = 0
        if (given := self.headers.get("range")) and given.startswith("bytes="):
            start = int(given[len("bytes=") :].split("-")[0])
        status = 206 if start else 200
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        headers["Content-Length"] = str(len(body))
        if head:
            self._send(200, b"", {**headers, "Content-Length": str(len(data))}, head=True)
            return
        with self.hub.lock:
            cut = name in self.hub.cut_once
            self.hub.cut_once.discard(name)
            failing = name in self.hub.failing
        if failing:
            self._send(500, b"storage unavailable")
            return
        if cut:
            # The whole length promised, half of it sent, the connection closed: the client must ask for the rest.
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self._send(status, body, headers)


# Larger than two of huggingface_hub's 10 MiB read chunks, so half of it is one whole chunk kept before the cut.
WEIGHTS = os.urandom(24 << 20)
MAIN_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"]}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "model.safetensors": WEIGHTS,
    "pytorch_model.bin": b"duplicate weights",
    "consolidated.pth": b"duplicate weights",
    "original/params.json": b"{}",
    "README.md": b"# a model",
    ".gitattributes": b"*.safetensors filter=lfs",
}
OLD_FILES = {"config.json": b'{"architectures": ["LlamaForCausalLM"], "old": true}', "model.safetensors": b"old"}
MAIN, OLD = "a" * 40, "b" * 40


@pytest.fixture
def hub() -> Iterator[tuple[Hub, str]]:
    state = Hub(
        repos={
            "org/tiny": Repo(commits={MAIN: MAIN_FILES, OLD: OLD_FILES}, refs={"main": MAIN, "v1": OLD}),
            "org/private": Repo(commits={MAIN: {"config.json": b"{}"}}, refs={"main": MAIN}, private=True),
            "org/gated": Repo(commits={MAIN: {"config.json": b"{}"}}, refs={"main": MAIN}, gated=True),
        }
    )
    handler = type("Handler", (HubHandler,), {"hub": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def download(
    endpoint: str, cache: Path, *args: str, token: str | None = None, offline: bool = False
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "TRANSFORMERS_OFFLINE"}
    env.update({"HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1"})
    env["HF_HOME"] = str(cache.parent / "hf-home")  # no token stored by a developer's login is picked up
    if token:
        env["HF_TOKEN"] = token
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    command = [sys.executable, "-m", "decision_server.cli", "download", *args, "--progress-every", "0.05"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)


def snapshot_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_only_what_a_server_loads_is_fetched_and_a_cut_is_resumed(hub: tuple[Hub, str], tmp_path: Path) -> None:
    state, endpoint = hub
    state.cut_once.add("model.safetensors")
    cache = tmp_path / "hub"
    result = download(endpoint, cache, "org/tiny")
    assert result.returncode == 0, result.stderr
    folder = Path(result.stdout.strip().splitlines()[-1])
    assert folder == cache / "models--org--tiny" / "snapshots" / MAIN
    expected = {
        name: MAIN_FILES[name]
        for name in (
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "chat_template.jinja",
            "model.safetensors",
        )
    }
    assert snapshot_files(folder) == expected, "no .bin/.pth duplicates, no subfolders, no README"
    assert (cache / "models--org--tiny" / "refs" / "main").read_text() == MAIN
    gets = [
        (path, rng) for method, path, rng in state.requests if method == "GET" and path.endswith("model.safetensors")
    ]
    assert len(gets) == 2 and gets[0][1] is None and gets[1][1] is not None, f"the rest is asked for by range: {gets}"
    assert int(gets[1][1].split("=")[1].split("-")[0]) > 0
    assert "downloading org/tiny@main (commit aaaaaaaaaaaa)" in result.stderr, result.stderr
    assert "5 of 5 files" in result.stderr and "consolidated.pth" in result.stderr
    assert "(100 %)" in result.stderr and "/s, ETA" in result.stderr
    assert f"downloaded org/tiny@main into {folder}" in result.stderr
    others = [p for _, p, _ in state.requests if p.startswith("/api/") and not p.startswith("/api/models/org/tiny/")]
    assert others == [], "only the model's own routes: no telemetry"
    assert "HTTP Request" not in result.stderr, "no log line per request"

    # Again: everything is there, no file is fetched twice.
    state.requests.clear()
    again = download(endpoint, cache, "org/tiny")
    assert again.returncode == 0, again.stderr
    assert "0 of 5 files" in again.stderr
    assert not [r for r in state.requests if r[0] == "GET" and "/resolve/" in r[1]], state.requests


def test_a_failed_run_leaves_no_config_and_the_next_fetches_only_what_is_missing(
    hub: tuple[Hub, str], tmp_path: Path
) -> None:
    state, endpoint = hub
    state.failing.add("tokenizer.json")
    cache = tmp_path / "hub"
    failed = download(endpoint, cache, "org/tiny")
    assert failed.returncode == 3 and "org/tiny@main" in failed.stderr and "500" in failed.stderr, failed.stderr
    folder = cache / "models--org--tiny" / "snapshots" / MAIN
    kept = set(snapshot_files(folder)) if folder.exists() else set()
    assert "config.json" not in kept and "tokenizer.json" not in kept, "a snapshot without config.json is not served"
    assert not (cache / "models--org--tiny" / "refs" / "main").exists()

    state.failing.clear()
    state.requests.clear()
    again = download(endpoint, cache, "org/tiny")
    assert again.returncode == 0, again.stderr
    fetched = {path.rsplit("/", 1)[1] for method, path, _ in state.requests if method == "GET" and "/resolve/" in path}
    assert (
        fetched
        == {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "model.safetensors"} - kept
    )
    assert f"{5 - len(kept)} of 5 files" in again.stderr


def test_a_revision_by_tag_suffix_or_flag(hub: tuple[Hub, str], tmp_path: Path) -> None:
    _, endpoint = hub
    cache = tmp_path / "hub"
    for args in (["org/tiny@v1"], ["org/tiny", "--revision", "v1"], [f"org/tiny@{OLD}"]):
        result = download(endpoint, cache, *args)
        assert result.returncode == 0, result.stderr
        folder = Path(result.stdout.strip().splitlines()[-1])
        assert folder.name == OLD and snapshot_files(folder) == OLD_FILES
    assert (cache / "models--org--tiny" / "refs" / "v1").read_text() == OLD
    assert not (cache / "models--org--tiny" / "refs" / "main").exists()
    result = download(endpoint, cache, "org/tiny@v9")
    assert result.returncode == 3 and "org/tiny has no revision 'v9'" in result.stderr, result.stderr
    result = download(endpoint, cache, "org/tiny@v1", "--revision", "v2")
    assert result.returncode == 3 and "names revision 'v1' but --revision says 'v2'" in result.stderr


def test_refusals_name_the_repo(hub: tuple[Hub, str], tmp_path: Path) -> None:
    _, endpoint = hub
    cache = tmp_path / "hub"
    missing = download(endpoint, cache, "org/absent")
    assert missing.returncode == 3
    assert (
        f"org/absent: no such model on {endpoint}, or no access to it (set HF_TOKEN if it is private; HTTP 404)"
        in missing.stderr
    )
    private = download(endpoint, cache, "org/private")
    assert private.returncode == 3 and "org/private: no such model" in private.stderr and "HTTP 401" in private.stderr
    wrong = download(endpoint, cache, "org/private", token="hf_wrong")
    assert wrong.returncode == 3 and "HF_TOKEN was refused" in wrong.stderr and "HTTP 401" in wrong.stderr
    allowed = download(endpoint, cache, "org/private", token=TOKEN)
    assert allowed.returncode == 0, allowed.stderr
    gated = download(endpoint, cache, "org/gated")
    assert gated.returncode == 3 and "org/gated is a gated model" in gated.stderr and "HF_TOKEN" in gated.stderr
    offline = download(endpoint, cache, "org/tiny", offline=True)
    assert offline.returncode == 3
    assert (
        "org/tiny@main is not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it" in offline.stderr
    )
    dead = download("http://127.0.0.1:9", cache, "org/tiny")
    assert dead.returncode == 3 and "org/tiny@main: cannot reach http://127.0.0.1:9" in dead.stderr, dead.stderr
    for result in (missing, private, gated, offline, dead):
        assert "Traceback" not in result.stderr, result.stderr
    assert not (cache / "models--org--absent" / "snapshots").exists()


def test_the_files_a_server_loads() -> None:
    assert needed_files(MAIN_FILES) == [
        "chat_template.jinja",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "config.json",
    ]
    assert needed_files(
        ["config.json", "pytorch_model.bin", "consolidated.pth", "vocab.json", "merges.txt", "x.gguf"]
    ) == ["merges.txt", "pytorch_model.bin", "vocab.json", "config.json"], (
        "bin weights only when there are no safetensors"
    )
    sharded = [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
        "pytorch_model-00001-of-00002.bin",
        "joint_head.safetensors",
        "joint_head_config.json",
    ]
    assert needed_files(sharded) == [
        "joint_head.safetensors",
        "joint_head_config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "config.json",
    ]
    assert split_model_id("org/name@v2", None) == ("org/name", "v2")
    assert split_model_id("org/name", "dev") == ("org/name", "dev")
    assert split_model_id("org/name", None) == ("org/name", "main")
    assert [duration_text(s) for s in (0.4, 59.6, 61, 3600 * 80 + 49 * 60 + 5)] == [
        "0 s",
        "1 min 00 s",
        "1 min 01 s",
        "80 h 49 min",
    ]
