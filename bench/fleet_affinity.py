"""State affinity A/B on a local fleet: N launchers behind one nginx, round-robin against `hash … consistent` on
the `x-decision-affinity` key (docs/deploy.md#state-affinity). Each state's questions go as separate requests; the
figure is the prompt tokens the fleet computed per state (`decision_computed_tokens_total` summed over replicas) and
on how many replicas a state was computed.

    .venv/bin/python bench/fleet_affinity.py --replicas 3 --states 6 --questions 4 --out bench/results/DIR/affinity.json

Needs nginx on PATH (Debian's `nginx`). Both modes run in one process against the same replicas, with states of
their own (no cache shared between the modes)."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / ".venv" / "bin" / "decision-launcher"


def affinity_key(state: Any, cache_salt: str = "", instructions: str | None = None) -> str:
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    document = ["decision-affinity/1", cache_salt, instructions, text, [], [], []]
    return hashlib.sha256(json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()).hexdigest()[:32]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return str(r.read().decode())


def post(url: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, str], dict[str, Any]]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=300) as r:
        return r.status, dict(r.headers), json.loads(r.read())


def computed_tokens(port: int) -> float:
    found = re.search(r"^decision_computed_tokens_total (\S+)$", get(f"http://127.0.0.1:{port}/metrics"), re.M)
    return float(found.group(1)) if found else 0.0


NGINX = """
worker_processes 1;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    map $http_x_decision_affinity $decision_affinity {{
        ""      $request_id;
        default $http_x_decision_affinity;
    }}
    upstream affinity {{
        hash $decision_affinity consistent;
{servers}
    }}
    upstream round_robin {{
{servers}
    }}
    server {{
        listen 127.0.0.1:{affinity_port};
        location / {{ proxy_pass http://affinity; add_header x-upstream $upstream_addr always; }}
    }}
    server {{
        listen 127.0.0.1:{round_robin_port};
        location / {{ proxy_pass http://round_robin; add_header x-upstream $upstream_addr always; }}
    }}
}}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--states", type=int, default=6)
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fleet-affinity-"))
    ports = [free_port() for _ in range(args.replicas)]
    launchers = []
    for i, port in enumerate(ports):
        log = open(work / f"replica{i}.log", "wb")
        launchers.append(
            subprocess.Popen(
                [str(LAUNCHER), "--hostname", "127.0.0.1", "--port", str(port), "--uds-path", str(work / f"r{i}.sock")],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    nginx = None
    try:
        for port in ports:
            deadline = time.monotonic() + 600
            while True:
                try:
                    if get(f"http://127.0.0.1:{port}/ready"):
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"replica on {port} not ready")
                time.sleep(1)
        modes = {"round_robin": free_port(), "affinity": free_port()}
        servers = "\n".join(f"        server 127.0.0.1:{p};" for p in ports)
        conf = work / "nginx.conf"
        conf.write_text(
            NGINX.format(
                dir=work, servers=servers, affinity_port=modes["affinity"], round_robin_port=modes["round_robin"]
            )
        )
        nginx = subprocess.Popen(["nginx", "-p", str(work), "-c", str(conf), "-g", "daemon off;"])
        time.sleep(1)
        report: dict[str, Any] = {"replicas": args.replicas, "states": args.states, "questions": args.questions}
        for mode, port in modes.items():
            before = sum(computed_tokens(p) for p in ports)
            placements = []
            started = time.monotonic()
            for s in range(args.states):
                text = "the refund has not arrived and the invoice is wrong. " * 20
                state = {"ticket": f"{mode} ticket {s}: {text}"}
                key = affinity_key(state)
                upstreams = set()
                for q in range(args.questions):
                    question = {"type": "noul", "instructions": f"Is point {q} raised?"}
                    body = {"state": state, "questions": {f"q{q}": question}}
                    url = f"http://127.0.0.1:{port}/v1/systemone"
                    status, headers, _ = post(url, body, {"x-decision-affinity": key})
                    assert status == 200 and headers["x-decision-affinity"] == key, (status, headers)
                    upstreams.add(headers["x-upstream"])
                placements.append(len(upstreams))
            computed = sum(computed_tokens(p) for p in ports) - before
            report[mode] = {
                "computed_tokens_per_state": computed / args.states,
                "replicas_per_state": sum(placements) / len(placements),
                "seconds": round(time.monotonic() - started, 2),
            }
            print(mode, report[mode], flush=True)
        report["ratio_round_robin_over_affinity"] = round(
            report["round_robin"]["computed_tokens_per_state"] / report["affinity"]["computed_tokens_per_state"], 3
        )
        print(json.dumps(report), flush=True)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        for launcher in launchers:
            launcher.terminate()
        for launcher in launchers:
            launcher.wait(60)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
