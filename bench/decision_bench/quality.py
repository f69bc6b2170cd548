"""`decision-quality`: does reading a question in several orders, dividing out a label prior, or a fitted calibration
make a model's decisions better? Accuracy, flip rate over all orders of each 3-4-option choice (with a repeat-noise
floor), ECE and log-loss per labelled set (quality_sets.py) and mode, as JSON and PNG plots (docs/quality.md).

    decision-quality --launch --out bench/results/DAY-quality      # starts the embedded model, stops it after
    decision-quality --url http://127.0.0.1:3000 --out DIR --modes plain,rotate

Modes: `plain` (`x_debias: off`), `rotate` (`x_debias: rotate`), `prior` (`x_debias: prior`: rotate + the label
prior, PriDe), `calibrated` (plain reads with `x_calibration`: a fit per set posted to `/v1/calibrations` from the
set's fit split, which no mode is scored on). Every mode reads the same eval split: each choice item in every order
of its options (n!; `--orders cyclic` for n), all orders of an item as questions of one request (they share its state
and are read independently: the tree engine's questions see the state, never each other), yes/no and score items
once. The client is stdlib only; the plots need matplotlib (the bench's `plots` extra)."""

from __future__ import annotations

import argparse
import http.client
import json
import shlex
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from decision_bench.launched import LaunchError, launched
from decision_bench.order_quality import disagreement, ece, flip_rate, log_loss, orders, reliability
from decision_bench.quality_sets import DATA_DIR, INSTRUCTIONS, Item, LabelledSet, fit_split, load

MODES = ("plain", "rotate", "prior", "calibrated")
DEBIAS = {"plain": "off", "rotate": "rotate", "prior": "prior", "calibrated": "off"}
FIT_FRACTION = 0.4


class ServerError(Exception):
    """The server answered a status other than the one expected; the message has the status and its body."""


class Client:
    def __init__(self, url: str, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.host, self.port, self.timeout = parsed.hostname or "127.0.0.1", parsed.port or 80, timeout
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        data = None if body is None else json.dumps(body)
        headers = {"content-type": "application/json"} if data is not None else {}
        try:
            self.conn.request(method, path, data, headers)
            response = self.conn.getresponse()
        except (ConnectionError, http.client.HTTPException):
            # A keep-alive connection the server closed: one fresh try.
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            self.conn.request(method, path, data, headers)
            response = self.conn.getresponse()
        raw = response.read()
        if response.status != expect:
            raise ServerError(f"{method} {path}: {response.status}: {raw[:2000].decode(errors='replace')}")
        return json.loads(raw) if raw else None


def question(item: Item, order: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The item's question in the System One shape, a choice's options in `order` (the canonical one by default)."""
    if item.kind == "choice":
        described = dict(item.options)
        names = order or item.names
        return {"type": "choice", "instructions": item.question, "criteria": {n: described[n] for n in names}}
    if item.kind == "score":
        return {"type": "score", "instructions": item.question, "criteria": list(item.names)}
    return {"type": "noul", "instructions": item.question}


def item_orders(item: Item, which: str) -> list[tuple[str, ...]]:
    if item.kind != "choice":
        return [()]
    if which == "cyclic":
        names = item.names
        return [names[k:] + names[:k] for k in range(len(names))]
    return orders(item.names)


@dataclass
class Read:
    """One question read: its item, the order it was listed in, and what the server answered."""

    item: str
    order: tuple[str, ...]
    chosen: str  # choice: the option; noul: "true"/"false"; score: the most probable level's index
    confidence: float  # the chosen outcome's probability
    truth: float  # the probability of the right answer
    correct: bool
    order_sensitivity: float | None = None
    calibration: Any = None
    prior_samples: int | None = None  # set when the read was prior-corrected (x_debias prior)


def read_answer(item: Item, answer: dict[str, Any]) -> tuple[str, float, float]:
    """(chosen, its probability, the right answer's probability) from one answer of /v1/systemone."""
    if item.kind == "choice":
        p = answer["probabilities"]
        return answer["choice"], float(p[answer["choice"]]), float(p[str(item.answer)])
    if item.kind == "noul":
        yes = float(answer["noul"])
        chosen = "true" if yes >= 0.5 else "false"
        return chosen, max(yes, 1.0 - yes), yes if item.answer else 1.0 - yes
    levels = {int(k): float(v) for k, v in answer["probabilities"].items()}
    best = max(levels, key=lambda k: (levels[k], -k))
    return str(best), levels[best], levels[int(item.answer)]


def expected(item: Item) -> str:
    if item.kind == "noul":
        return "true" if item.answer else "false"
    return str(item.answer)


@dataclass
class ModeRun:
    reads: list[Read] = field(default_factory=list)
    seconds: float = 0.0
    input_tokens: int = 0
    requests: int = 0


def read_item(
    client: Client, item: Item, mode: str, salt: str, which: str, calibration: str | None
) -> tuple[list[Read], int]:
    """Every order of the item as one request; its reads and the request's input tokens."""
    item_order = item_orders(item, which)
    body: dict[str, Any] = {
        "state": item.state,
        "instructions": INSTRUCTIONS,
        "cache_salt": salt,
        "x_debias": DEBIAS[mode],
        "questions": {f"o{k}": question(item, order or None) for k, order in enumerate(item_order)},
    }
    if calibration is not None:
        body["x_calibration"] = calibration
    payload = client.call("POST", "/v1/systemone", body)
    diagnostics = payload.get("x_diagnostics") or {}
    reads = []
    for k, order in enumerate(item_order):
        answer = payload["answers"][f"o{k}"]
        chosen, confidence, truth = read_answer(item, answer)
        diag = diagnostics.get(f"o{k}") or {}
        reads.append(
            Read(
                item.id,
                order,
                chosen,
                confidence,
                truth,
                chosen == expected(item),
                diag.get("order_sensitivity"),
                diag.get("calibration"),
                diag.get("prior_samples"),
            )
        )
    return reads, int(payload["usage"]["input_tokens"])


def run_mode(
    client: Client, items: list[Item], mode: str, salt: str, which: str, calibration: str | None = None
) -> ModeRun:
    run = ModeRun()
    started = time.perf_counter()
    for item in items:
        reads, tokens = read_item(client, item, mode, salt, which, calibration)
        run.reads += reads
        run.input_tokens += tokens
        run.requests += 1
    run.seconds = time.perf_counter() - started
    return run


def by_item(reads: list[Read]) -> list[list[str]]:
    grouped: dict[str, list[str]] = {}
    for r in reads:
        grouped.setdefault(r.item, []).append(r.chosen)
    return list(grouped.values())


def noise_floor(first: list[Read], again: list[Read]) -> dict[str, float]:
    """The same reads (item, order) twice: the share of items with any read whose choice changed (comparable to the
    flip rate), the share of reads that changed, and the largest change of the chosen option's probability."""
    if len(first) != len(again) or any(
        (a.item, a.order) != (b.item, b.order) for a, b in zip(first, again, strict=True)
    ):
        raise ValueError("noise floor: the repeat must read the same items in the same orders")
    changed_items = {a.item for a, b in zip(first, again, strict=True) if a.chosen != b.chosen}
    items = {a.item for a in first}
    return {
        "flip_rate": len(changed_items) / len(items) if items else 0.0,
        "read_changes": sum(a.chosen != b.chosen for a, b in zip(first, again, strict=True)) / len(first)
        if first
        else 0.0,
        "max_abs_confidence_change": max(
            (abs(a.confidence - b.confidence) for a, b in zip(first, again, strict=True)), default=0.0
        ),
    }


def summarize(run: ModeRun, kind: str) -> dict[str, Any]:
    reads = run.reads
    confidences = [r.confidence for r in reads]
    correct = [r.correct for r in reads]
    sensitivity = [r.order_sensitivity for r in reads if r.order_sensitivity is not None]
    summary: dict[str, Any] = {
        "reads": len(reads),
        "items": len({r.item for r in reads}),
        "accuracy": sum(correct) / len(reads) if reads else None,
        "ece": ece(confidences, correct),
        "log_loss": log_loss([r.truth for r in reads]),
        "reliability": reliability(confidences, correct),
        "chosen": dict(Counter(r.chosen for r in reads).most_common()),
    }
    if kind == "choice":
        choices = by_item(reads)
        summary["flip_rate"] = flip_rate(choices)
        summary["disagreement"] = disagreement(choices)
        # Where the chosen option sat in the order sent: a model that prefers a position shows it here.
        summary["chosen_position"] = dict(sorted(Counter(r.order.index(r.chosen) for r in reads).items()))
    summary["mean_order_sensitivity"] = sum(sensitivity) / len(sensitivity) if sensitivity else None
    summary["prior_corrected"] = sum(r.prior_samples is not None for r in reads) / len(reads) if reads else None
    calibrations = Counter(json.dumps(r.calibration, sort_keys=True) for r in reads if r.calibration is not None)
    if calibrations:
        summary["calibration_reports"] = {k: v for k, v in calibrations.most_common(3)}
    summary["questions_per_s"] = len(reads) / run.seconds if run.seconds else None
    summary["input_tokens_per_request"] = run.input_tokens / run.requests if run.requests else None
    summary["seconds"] = run.seconds
    return summary


def calibration_examples(items: list[Item]) -> list[dict[str, Any]]:
    """The fit split as /v1/calibrations examples; a choice in each of its cyclic rotations (every option at every
    position once), so the fit sees the orders it will be applied to."""
    examples = []
    for item in items:
        for order in item_orders(item, "cyclic"):
            examples.append(
                {
                    "state": item.state,
                    "instructions": INSTRUCTIONS,
                    "questions": {"q": question(item, order or None)},
                    "answers": {"q": item.answer},
                }
            )
    return examples


def fit(client: Client, labelled: LabelledSet, items: list[Item], seed: int) -> dict[str, Any]:
    body = {"name": f"quality-{labelled.name}", "examples": calibration_examples(items), "seed": seed}
    result: dict[str, Any] = client.call("POST", "/v1/calibrations", body, expect=201)
    return result


def evaluate(
    client: Client,
    sets: tuple[LabelledSet, ...],
    modes: list[str],
    which: str,
    fit_fraction: float,
    seed: int,
    repeat: bool,
    max_reads: int | None = None,
    log: Any = sys.stderr,
    on_set: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    salt = f"quality-{time.time_ns()}"
    report: dict[str, Any] = {"orders": which, "fit_fraction": fit_fraction, "max_reads_per_set": max_reads, "sets": []}
    for labelled in sets:
        fit_items = [i for i in labelled.items if fit_split(i.id, fit_fraction)]
        eval_items = eval_split(labelled, fit_fraction, which, max_reads)
        entry: dict[str, Any] = {
            "name": labelled.name,
            "type": labelled.kind,
            "measures": labelled.measures,
            "items": len(labelled.items),
            "fit_items": len(fit_items),
            "eval_items": len(eval_items),
            "modes": {},
        }
        plain_run = None
        for mode in modes:
            calibration = None
            if mode == "calibrated":
                try:
                    fitted = fit(client, labelled, fit_items, seed)
                except ServerError as e:
                    entry["modes"][mode] = {"error": str(e)}
                    print(f"{labelled.name} {mode}: {e}", file=log)
                    continue
                entry["calibration"] = fitted
                calibration = fitted["id"]
            run = run_mode(client, eval_items, mode, f"{salt}-{mode}", which, calibration)
            entry["modes"][mode] = summarize(run, labelled.kind)
            if mode == "plain":
                plain_run = run
            print(f"{labelled.name} {mode}: {_line(entry['modes'][mode])}", file=log)
        if repeat and plain_run is not None and labelled.kind == "choice":
            again = run_mode(client, eval_items, "plain", f"{salt}-plain-again", which)
            entry["repeat_noise"] = noise_floor(plain_run.reads, again.reads)
            print(f"{labelled.name} repeat noise: {entry['repeat_noise']}", file=log)
        report["sets"].append(entry)
        if on_set is not None:
            on_set(report)  # a long run keeps what it has measured so far
    return report


def eval_split(labelled: LabelledSet, fit_fraction: float, which: str, max_reads: int | None) -> list[Item]:
    """The items no calibration is fitted on, in file order (each label in turn), as many as fit in `max_reads`
    reads per mode (a 4-option choice in all orders is 24 reads, a 3-option one 6, a yes/no or score 1)."""
    items = []
    reads = 0
    for item in labelled.items:
        if fit_split(item.id, fit_fraction):
            continue
        reads += len(item_orders(item, which))
        if max_reads is not None and reads > max_reads:
            break
        items.append(item)
    return items


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """`new`'s modes (and its calibration fits) added to `old`'s sets: a mode run later on the same eval split."""
    for key in ("orders", "fit_fraction", "max_reads_per_set"):
        if old.get(key) != new.get(key):
            raise ValueError(f"--merge-into: {key} differs ({old.get(key)!r} there, {new.get(key)!r} here)")
    sets = {entry["name"]: entry for entry in old["sets"]}
    for entry in new["sets"]:
        if entry["name"] not in sets:
            old["sets"].append(entry)
            continue
        into = sets[entry["name"]]
        if into["eval_items"] != entry["eval_items"]:
            raise ValueError(f"--merge-into: set {entry['name']!r} has {into['eval_items']} eval items there")
        into["modes"].update(entry["modes"])
        for key in ("calibration", "repeat_noise"):
            if key in entry:
                into[key] = entry[key]
    old.setdefault("merged_commands", []).append(new.get("command"))
    return old


MODE_NAMES = {"plain": "plain", "rotate": "rotate", "prior": "rotate + prior", "calibrated": "calibrated"}


def markdown(report: dict[str, Any]) -> str:
    """The report as one Markdown table: a row per set and mode (docs/quality.md shows it)."""

    def number(value: Any, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    lines = [
        "| set (eval items, type) | mode | accuracy | flip rate (floor) | reads off majority | ECE | log-loss | "
        "mean order sensitivity | prior-corrected reads | questions/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in report["sets"]:
        floor = entry.get("repeat_noise", {}).get("flip_rate")
        for mode, s in entry["modes"].items():
            if "error" in s:
                cells = ["-"] * 8
                cells[0] = f"not run: {s['error'][:100]}"
                lines.append(
                    f"| {entry['name']} ({entry['eval_items']}) | {MODE_NAMES.get(mode, mode)} | {' | '.join(cells)} |"
                )
                continue
            flip = number(s.get("flip_rate"))
            if s.get("flip_rate") is not None and floor is not None:
                flip += f" ({floor:.3f})"
            lines.append(
                f"| {entry['name']} ({entry['eval_items']}, {entry['type']}) | {MODE_NAMES.get(mode, mode)} | "
                f"{number(s['accuracy'])} | {flip} | {number(s.get('disagreement'))} | {number(s['ece'])} | "
                f"{number(s['log_loss'])} | {number(s.get('mean_order_sensitivity'))} | "
                f"{number(s.get('prior_corrected'), 2)} | {number(s.get('questions_per_s'), 2)} |"
            )
    return "\n".join(lines) + "\n"


def _line(summary: dict[str, Any]) -> str:
    keys = ("accuracy", "flip_rate", "ece", "log_loss", "questions_per_s")
    return ", ".join(f"{k} {summary[k]:.3f}" for k in keys if summary.get(k) is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="decision-quality", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="A running server, e.g. http://127.0.0.1:3000")
    where.add_argument(
        "--launch",
        nargs="?",
        const="",
        help="Start decision-launcher for the run with these arguments (--launch alone: the embedded model), "
        "stopped at the end; its log goes to OUT/server.log",
    )
    parser.add_argument("--launch-timeout", type=float, default=900.0)
    parser.add_argument("--launcher", help=argparse.SUPPRESS)  # the program --launch starts (tests)
    parser.add_argument("--out", type=Path, required=True, help="Folder for quality.json and the PNG plots")
    parser.add_argument("--modes", default=",".join(MODES), help=f"Comma list of {', '.join(MODES)}")
    parser.add_argument("--sets", help="Comma list of set names (default all under --data)")
    parser.add_argument("--data", type=Path, default=DATA_DIR, help="Folder of the sets (sets.json and its JSONL)")
    parser.add_argument(
        "--orders", choices=("all", "cyclic"), default="all", help="Each choice in all n! orders, or its n rotations"
    )
    parser.add_argument("--fit-fraction", type=float, default=FIT_FRACTION, help="Items kept for the calibration fit")
    parser.add_argument(
        "--max-reads",
        type=int,
        help="At most this many reads per set and mode (eval items in file order, which takes each label in turn, "
        "each in all its orders): a shorter run",
    )
    parser.add_argument(
        "--merge-into",
        type=Path,
        help="A quality.json from an earlier run with the same --orders/--fit-fraction/--max-reads: this run's modes "
        "are added to it (e.g. --modes calibrated once the server has /v1/calibrations)",
    )
    parser.add_argument("--seed", type=int, default=45, help="The calibration fit's seed (its holdout split)")
    parser.add_argument("--no-repeat", action="store_true", help="Skip the repeat-noise floor (a second plain pass)")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds one request may take")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown} (choose from {', '.join(MODES)})")
    if not 0.0 < args.fit_fraction < 1.0:
        parser.error(f"--fit-fraction must be between 0 and 1, got {args.fit_fraction}")
    try:
        sets = load(args.data, args.sets.split(",") if args.sets else None)
    except (OSError, ValueError) as e:
        parser.error(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        url = args.url
        if url is None:
            try:
                url = stack.enter_context(
                    launched(shlex.split(args.launch), args.out / "server.log", args.launch_timeout, args.launcher)
                )
            except LaunchError as e:
                print(f"decision-quality: {e}", file=sys.stderr)
                return 1
        client = Client(url, args.timeout)
        info = client.call("GET", "/info")
        started = time.time()
        partial = args.out / "quality.partial.json"
        report = evaluate(
            client,
            sets,
            modes,
            args.orders,
            args.fit_fraction,
            args.seed,
            not args.no_repeat,
            args.max_reads,
            on_set=lambda so_far: partial.write_text(json.dumps(so_far, indent=1) + "\n"),
        )
        partial.unlink(missing_ok=True)
        report["model"] = info.get("model_id")
        report["server"] = {k: info.get(k) for k in ("model_id", "model_dtype", "version", "read_mode") if k in info}
        report["wall_s"] = time.time() - started
        report["command"] = " ".join(
            shlex.quote(a) for a in (sys.argv if argv is None else ["decision-quality", *argv])
        )
    if args.merge_into:
        try:
            report = merge(json.loads(args.merge_into.read_text()), report)
        except (OSError, ValueError) as e:
            print(f"decision-quality: {e}", file=sys.stderr)
            return 1
    path = args.out / "quality.json"
    path.write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "quality.md").write_text(markdown(report))
    print(path)
    if not args.no_plots:
        from decision_bench.quality_plots import plot_all

        for png in plot_all(report, args.out):
            print(png)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
