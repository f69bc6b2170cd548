"""`decision-bench`: seeded closed-loop load on /v1/systemone, one server or two in interleaved A/B rounds, or with
--rate an open loop (arrivals at a rate, answered or not) on one server.

The JSON report goes to stdout (and --json FILE); progress goes to stderr. It also summarizes the Server-Timing the
decision router sends per answer, and, with --watch-pid, the resident memory of the server's processes (soak tests)."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from decision_bench import __version__, metrics, rss
from decision_bench.report import ratios, server_summary
from decision_bench.runner import RoundResult, fetch_metrics, run_open_round, run_round
from decision_bench.tokens import make_counter
from decision_bench.workload import KINDS, Workload, WorkloadSpec

WARMUP_TIME_LIMIT_S = 600.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="decision-bench",
        description="Closed-loop benchmark of /v1/systemone. With --url-b, A and B alternate in rounds (A,B,A,B,…) "
        "on the same seeded requests so machine noise hits both.",
        epilog="When a server answers with a Server-Timing header (the decision router: router, queue and shard "
        "milliseconds), its report gets `server_timing_ms` with p50/p95/p99/mean per name and router_plus_queue, "
        "the router's own overhead at concurrency 1. --watch-pid adds `rss`: resident memory over the measured rounds.",
    )
    parser.add_argument("--url", required=True, help="Server A, e.g. http://127.0.0.1:3000")
    parser.add_argument("--url-b", help="Server B: run A/B rounds and report B/A ratios")
    parser.add_argument("--state-tokens", type=int, default=512, help="Tokens per state, about (default 512)")
    parser.add_argument("--questions", type=int, default=8, help="Questions per request (default 8)")
    parser.add_argument("--options", type=int, default=4, help="Options per choice question (default 4)")
    parser.add_argument("--levels", type=int, default=5, help="Levels per score question (default 5)")
    parser.add_argument(
        "--mix",
        default=",".join(KINDS),
        help="Question kinds, cycled in order: question i is mix[i mod len] (default choice,noul,score)",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="Requests in flight per server (default 1)")
    parser.add_argument(
        "--rate",
        type=float,
        help="Open loop: requests arrive at this many per second, answered or not, instead of C closed-loop workers; "
        "latency runs from each scheduled arrival, and an arrival that finds --max-outstanding in flight is dropped "
        "(reported under `open_loop`)",
    )
    parser.add_argument(
        "--arrivals",
        choices=("poisson", "fixed"),
        default="poisson",
        help="Open loop: Poisson arrivals (seeded) or one every 1/RATE s (default poisson)",
    )
    parser.add_argument(
        "--max-outstanding",
        type=int,
        default=256,
        help="Open loop: the most requests in flight, one sender thread each (default 256)",
    )
    parser.add_argument(
        "--duration", type=float, default=30.0, help="Measured seconds per server, split over rounds (default 30)"
    )
    parser.add_argument(
        "--requests",
        type=int,
        help="Measured requests per server, split evenly over rounds: each round runs at most ceil(REQUESTS / ROUNDS)",
    )
    parser.add_argument("--rounds", type=int, help="Rounds per server (default 1, or 10 with --url-b)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="Unmeasured requests per server before the rounds (default 2)"
    )
    parser.add_argument(
        "--pause",
        type=float,
        default=0.0,
        help="Idle seconds before each measured round, so work a server keeps doing after its round (vLLM's "
        "worker spins a core for about a second) does not land on the next server's round (default 0)",
    )
    parser.add_argument("--seed", type=int, default=0, help="Workload seed (default 0)")
    parser.add_argument(
        "--repeat-state-fraction",
        type=float,
        default=0.0,
        help="Share of requests whose state is one of --hot-states repeated states (prefix-cache hits); default 0",
    )
    parser.add_argument("--hot-states", type=int, default=8, help="How many distinct repeated states (default 8)")
    parser.add_argument(
        "--tokenizer", help="Model folder with tokenizer.json (and chat template) for exact token counts"
    )
    parser.add_argument("--model", help="`model` field to send (default: none)")
    parser.add_argument(
        "--joint",
        action="store_true",
        help="Send `joint: true`: the questions of a request read together (DiffusionGemma canvases); default off",
    )
    parser.add_argument(
        "--bad-fraction",
        type=float,
        default=0.0,
        help="Share of measured requests replaced by deliberately bad ones (not JSON, cut short, missing or unknown "
        "fields, an empty choice, a state far over the token limit), reported apart under `bad_requests` with "
        "`not_4xx`, which a sound server keeps at 0 (default 0)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="Per-request timeout in seconds (default 300)")
    parser.add_argument("--label", help="Free text stored in the report (e.g. what A and B are)")
    parser.add_argument("--json", dest="json_out", help="Also write the report to this file")
    parser.add_argument(
        "--watch-pid",
        type=int,
        action="append",
        metavar="PID",
        help="Sample the resident memory (VmRSS, /proc) of this process and all its descendants while the measured "
        "rounds run; repeatable, the trees are summed. Reported under `rss`",
    )
    parser.add_argument(
        "--rss-interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="Seconds between --watch-pid samples (default 5)",
    )
    parser.add_argument(
        "--rss-settle",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="Seconds of the run before the RSS baseline that drift is measured from (default 60)",
    )
    parser.add_argument("--version", action="version", version=f"decision-bench {__version__}")
    args = parser.parse_args(argv)
    for name in ("concurrency", "duration", "questions", "state_tokens"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be > 0")
    if args.rate is not None and args.rate <= 0:
        parser.error("--rate must be > 0")
    if args.max_outstanding <= 0:
        parser.error("--max-outstanding must be > 0")
    if args.rate is not None and args.url_b:
        parser.error("--rate runs one server: no --url-b")
    if args.requests is not None and args.requests <= 0:
        parser.error("--requests must be > 0")
    if args.rounds is not None and args.rounds <= 0:
        parser.error("--rounds must be > 0")
    if args.warmup < 0:
        parser.error("--warmup must be ≥ 0")
    if args.pause < 0:
        parser.error("--pause must be ≥ 0")
    if args.rss_interval <= 0:
        parser.error("--rss-interval must be > 0")
    if args.rss_settle < 0:
        parser.error("--rss-settle must be ≥ 0")
    for pid in args.watch_pid or []:
        if pid <= 0 or not rss.is_running(pid):
            parser.error(f"--watch-pid {pid}: no such process in /proc (the memory watch needs Linux)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        spec = WorkloadSpec(
            state_tokens=args.state_tokens,
            questions=args.questions,
            options=args.options,
            seed=args.seed,
            mix=tuple(kind.strip() for kind in args.mix.split(",") if kind.strip()),
            levels=args.levels,
            repeat_state_fraction=args.repeat_state_fraction,
            hot_states=args.hot_states,
            model=args.model,
            joint=args.joint,
            bad_fraction=args.bad_fraction,
        )
        counter = make_counter(args.tokenizer)
    except (ValueError, FileNotFoundError, ImportError) as error:
        print(f"decision-bench: {error}", file=sys.stderr)
        return 2
    workload = Workload(spec, counter)

    servers = {"A": args.url} | ({"B": args.url_b} if args.url_b else {})
    rounds = args.rounds or (10 if args.url_b else 1)
    round_seconds = args.duration / rounds
    round_cap = math.ceil(args.requests / rounds) if args.requests else None

    for name, url in servers.items():
        if args.warmup:
            warm = run_round(
                url,
                workload,
                concurrency=args.concurrency,
                seconds=WARMUP_TIME_LIMIT_S,
                max_requests=args.warmup,
                first_index=0,
                stream="warmup",
                timeout=args.timeout,
            )
            statuses = sorted({outcome.status for outcome in warm.outcomes})
            _log(f"warmup {name}: {len(warm.outcomes)} requests in {warm.wall_seconds:.1f}s, statuses {statuses}")

    before = {name: fetch_metrics(url) for name, url in servers.items()}
    results: dict[str, list[RoundResult]] = {name: [] for name in servers}
    next_index = dict.fromkeys(servers, 0)
    started = time.time()
    watch = rss.Watch(args.watch_pid, args.rss_interval) if args.watch_pid else None
    if watch is not None:
        watch.start()
    for number in range(rounds):
        for name, url in servers.items():
            if args.pause:
                time.sleep(args.pause)
            if args.rate is not None:
                result = run_open_round(
                    url,
                    workload,
                    rate=args.rate,
                    seconds=round_seconds,
                    max_requests=round_cap,
                    max_outstanding=args.max_outstanding,
                    first_index=next_index[name],
                    poisson=args.arrivals == "poisson",
                    timeout=args.timeout,
                )
            else:
                result = run_round(
                    url,
                    workload,
                    concurrency=args.concurrency,
                    seconds=round_seconds,
                    max_requests=round_cap,
                    first_index=next_index[name],
                    timeout=args.timeout,
                )
            next_index[name] += len(result.outcomes)
            results[name].append(result)
            ok = len(result.ok)
            _log(
                f"round {number + 1}/{rounds} {name}: {ok}/{len(result.outcomes)} ok in {result.wall_seconds:.1f}s, "
                f"{ok * spec.questions / result.wall_seconds:.2f} questions/s"
            )
    rss_samples = watch.stop() if watch is not None else None
    after = {name: fetch_metrics(url) for name, url in servers.items()}

    report: dict[str, Any] = {
        "tool": f"decision-bench {__version__}",
        "label": args.label,
        "started_unix": round(started, 3),
        "command": shlex.join(["decision-bench", *(sys.argv[1:] if argv is None else argv)]),
        "workload": {
            "state_tokens": spec.state_tokens,
            "questions": spec.questions,
            "options": spec.options,
            "levels": spec.levels,
            "mix": list(spec.mix),
            "concurrency": args.concurrency,
            "rate": args.rate,
            "arrivals": args.arrivals if args.rate is not None else None,
            "max_outstanding": args.max_outstanding if args.rate is not None else None,
            "duration_s": args.duration,
            "requests": args.requests,
            "rounds": rounds,
            "warmup": args.warmup,
            "pause_s": args.pause,
            "seed": spec.seed,
            "repeat_state_fraction": spec.repeat_state_fraction,
            "joint": spec.joint,
            "token_counts": counter.source,
        },
        "servers": {},
    }
    for name, url in servers.items():
        summary = server_summary(url, results[name], spec.questions, counter.source)
        text_before, text_after = before[name], after[name]
        if text_before is not None and text_after is not None:
            summary["server_metrics"] = metrics.summarize(
                metrics.delta(metrics.parse(text_before), metrics.parse(text_after)), summary["seconds"]
            )
        report["servers"][name] = summary
    if "B" in report["servers"]:
        report["ratios_b_over_a"] = ratios(report["servers"]["A"], report["servers"]["B"])
    if rss_samples is not None:
        report["rss"] = {
            "pids": args.watch_pid,
            "interval_s": args.rss_interval,
            "settle_s": args.rss_settle,
            **rss.summarize(rss_samples, args.rss_settle),
        }

    text = json.dumps(report, indent=2, ensure_ascii=False)
    print(text)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(text + "\n")
    return 0


def _log(message: str) -> None:
    print(f"decision-bench: {message}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
