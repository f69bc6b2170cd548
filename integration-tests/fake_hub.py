"""A Hugging Face Hub stand-in on 127.0.0.1 for the launcher's downloads (HF_ENDPOINT): local folders served as model
repositories at one commit on `main`, with the API routes huggingface_hub calls (revision info, tree listing, file
resolve with HEAD and ranges). Unknown repositories answer 404 as the Hub does. The refusals (401, gated, a cut
transfer) are tested against the shard's command alone: server/tests/test_hub.py."""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "c" * 40


def _oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, repos: dict[str, Path]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.repos = repos
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def files(self, repo: str) -> dict[str, Path]:
        folder = self.repos[repo]
        return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeHub

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _send(self, status: int, body: bytes, headers: dict[str, str], head: bool, length: int | None = None) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _serve(self, head: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        with self.server.lock:
            self.server.requests.append((self.command, path))
        parts = path.strip("/").split("/")
        api = parts[:2] == ["api", "models"] and len(parts) >= 6
        repo = "/".join(parts[2:4] if api else parts[:2])
        revision = parts[5] if api else (parts[3] if len(parts) >= 5 else "")
        if repo not in self.server.repos:
            self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound"}, head)
            return
        if revision not in ("main", COMMIT):
            self._send(404, b'{"error": "Invalid rev id"}', {"X-Error-Code": "RevisionNotFound"}, head)
            return
        files = self.server.files(repo)
        if api and parts[4] == "revision":
            siblings = [{"rfilename": name, "size": p.stat().st_size} for name, p in files.items()]
            body = json.dumps({"id": repo, "sha": COMMIT, "siblings": siblings}).encode()
            self._send(200, body, {"Content-Type": "application/json"}, head)
        elif api and parts[4] == "tree":
            entries = [
                {"type": "file", "path": name, "size": p.stat().st_size, "oid": _oid(p.read_bytes())}
                for name, p in files.items()
            ]
            self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"}, head)
        elif not api and len(parts) >= 5 and parts[2] == "resolve" and "/".join(parts[4:]) in files:
            data = files["/".join(parts[4:])].read_bytes()
            headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
            start = int(r[len("bytes=") :].split("-")[0]) if (r := self.headers.get("range")) else 0
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206 if start else 200, data[start:], headers, head, length=len(data) if head else None)
        else:
            self._send(404, b'{"error": "Entry not found"}', {"X-Error-Code": "EntryNotFound"}, head)


@contextmanager
def serving(repos: dict[str, Path]) -> Iterator[FakeHub]:
    hub = FakeHub(repos)
    thread = threading.Thread(target=hub.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.shutdown()
        hub.server_close()
