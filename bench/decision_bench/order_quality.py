"""Order sensitivity of a decision server on a small labelled set: each question read in every order of its options
(all n! of 3-4 options), plain and with `x_debias` modes, and per mode its accuracy, flip rate, ECE and log-loss
over all orders, with a repeat-noise floor (the same order read twice) and the cost (questions/s, prompt tokens).

    python -m decision_bench.order_quality --url http://127.0.0.1:3000 --json out.json

The set (`ITEMS`) is built here: short passages that state the answer, so a small model has signal to read and the
labels are certain. It is a probe of order effects, not a benchmark of model quality. Stdlib only."""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import math
import sys
import time
import urllib.parse
from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Item:
    state: str
    question: str
    options: tuple[str, ...]
    answer: str


ITEMS: tuple[Item, ...] = (
    Item(
        "Maria moved to Lisbon in 2019 and works as a nurse at the city hospital.",
        "Which city does Maria live in?",
        ("Lisbon", "Porto", "Madrid", "Paris"),
        "Lisbon",
    ),
    Item(
        "The parcel left the warehouse on Monday and was delivered on Thursday morning.",
        "On which day was the parcel delivered?",
        ("Monday", "Tuesday", "Thursday", "Friday"),
        "Thursday",
    ),
    Item(
        "Tom paid for the concert tickets with his credit card because he had no cash.",
        "How did Tom pay?",
        ("cash", "credit card", "bank transfer"),
        "credit card",
    ),
    Item(
        "The laptop's screen cracked after it fell off the desk; the keyboard still works.",
        "What is broken?",
        ("keyboard", "screen", "battery", "charger"),
        "screen",
    ),
    Item(
        "Our cat is called Whiskers, our dog is called Rex, and the parrot is called Polly.",
        "What is the dog's name?",
        ("Whiskers", "Rex", "Polly"),
        "Rex",
    ),
    Item(
        "The meeting was moved from room 4 to room 12 because the projector in room 4 broke.",
        "Where is the meeting now?",
        ("room 4", "room 7", "room 12", "room 2"),
        "room 12",
    ),
    Item(
        "Anna is allergic to peanuts, so she ordered the salad instead of the satay.",
        "What did Anna order?",
        ("satay", "salad", "soup"),
        "salad",
    ),
    Item(
        "I was charged twice for my March invoice and I want one of the payments refunded.",
        "What does the customer want?",
        ("a refund", "a discount", "a new invoice", "to cancel the account"),
        "a refund",
    ),
    Item(
        "The train to Berlin was cancelled, so Paul took the bus and arrived three hours late.",
        "How did Paul travel?",
        ("train", "bus", "car", "plane"),
        "bus",
    ),
    Item(
        "The bakery opens at 7 am on weekdays and at 9 am on Sundays.",
        "When does the bakery open on Sundays?",
        ("7 am", "8 am", "9 am"),
        "9 am",
    ),
    Item(
        "Lena's favourite colour used to be blue, but since last year it has been green.",
        "What is Lena's favourite colour now?",
        ("blue", "green", "red", "yellow"),
        "green",
    ),
    Item(
        "The router keeps dropping the Wi-Fi connection every few minutes since the update.",
        "What kind of problem is this?",
        ("billing", "technical", "shipping"),
        "technical",
    ),
    Item(
        "Sam planted tomatoes in the garden and potatoes in the field behind the house.",
        "What did Sam plant in the garden?",
        ("potatoes", "carrots", "tomatoes", "beans"),
        "tomatoes",
    ),
    Item(
        "The hotel room faced the sea, and every morning we had breakfast on the balcony.",
        "What did the room face?",
        ("the mountains", "the sea", "the street"),
        "the sea",
    ),
    Item(
        "My password reset email never arrived, so I cannot log in to my account.",
        "Which team should handle this?",
        ("accounts", "sales", "shipping", "legal"),
        "accounts",
    ),
    Item(
        "Ben is twelve years old and his sister Clara is eight.",
        "How old is Clara?",
        ("six", "eight", "ten", "twelve"),
        "eight",
    ),
    Item(
        "The museum is closed on Mondays; on other days it opens at ten.",
        "On which day is the museum closed?",
        ("Monday", "Wednesday", "Saturday"),
        "Monday",
    ),
    Item(
        "Kim wrote the report in French and then translated it into English for the board.",
        "Which language was the report first written in?",
        ("English", "French", "German", "Spanish"),
        "French",
    ),
    Item(
        "The red car belongs to Omar; the blue one is his neighbour's.",
        "Whose is the red car?",
        ("Omar's", "the neighbour's", "nobody's"),
        "Omar's",
    ),
    Item(
        "Water boils at 100 degrees Celsius at sea level.",
        "At what temperature does water boil at sea level?",
        ("50 degrees", "100 degrees", "150 degrees", "0 degrees"),
        "100 degrees",
    ),
    Item(
        "The order arrived with a broken handle, and the customer asks for a replacement.",
        "What does the customer ask for?",
        ("a replacement", "a refund", "a review"),
        "a replacement",
    ),
    Item(
        "Julia runs every morning before work and swims on Saturdays.",
        "When does Julia swim?",
        ("every morning", "on Saturdays", "on Sundays", "after work"),
        "on Saturdays",
    ),
    Item(
        "The invoice was sent to the old address, so it never reached us.",
        "Why did the invoice not arrive?",
        ("wrong address", "wrong amount", "lost by the bank"),
        "wrong address",
    ),
    Item(
        "Leo ordered a large pizza with mushrooms and a small lemonade.",
        "What size was the pizza?",
        ("small", "medium", "large"),
        "large",
    ),
)

MODES = ("plain", "rotate", "prior")
INSTRUCTIONS = "Answer the question about the text."


def orders(options: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every order of the options (n! of them), the one given first."""
    return list(itertools.permutations(options))


def flip_rate(choices_per_item: list[list[str]]) -> float:
    """Share of items whose chosen option is not the same in every order read."""
    if not choices_per_item:
        return 0.0
    return sum(1 for choices in choices_per_item if len(set(choices)) > 1) / len(choices_per_item)


def disagreement(choices_per_item: list[list[str]]) -> float:
    """Share of reads whose choice differs from their item's most frequent choice."""
    total = sum(len(c) for c in choices_per_item)
    off = sum(len(c) - Counter(c).most_common(1)[0][1] for c in choices_per_item if c)
    return off / total if total else 0.0


def reliability(confidences: list[float], correct: list[bool], bins: int = 10) -> list[dict[str, float | int]]:
    """Per equal-width confidence bin (the first one closed at 0): its reads, their mean confidence and accuracy.
    Empty bins are left out. The reliability diagram plots these; ECE weighs their gaps."""
    rows: list[dict[str, float | int]] = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, c in enumerate(confidences) if lo < c <= hi or (b == 0 and c == 0.0)]
        if idx:
            rows.append(
                {
                    "lo": lo,
                    "hi": hi,
                    "n": len(idx),
                    "confidence": sum(confidences[i] for i in idx) / len(idx),
                    "accuracy": sum(correct[i] for i in idx) / len(idx),
                }
            )
    return rows


def ece(confidences: list[float], correct: list[bool], bins: int = 10) -> float:
    """Expected calibration error of the chosen option's probability, equal-width bins."""
    n = len(confidences)
    if n == 0:
        return 0.0
    return sum(r["n"] / n * abs(r["accuracy"] - r["confidence"]) for r in reliability(confidences, correct, bins))


def log_loss(true_probabilities: list[float]) -> float:
    """Mean negative log-probability of the right answer (floored at 1e-15)."""
    if not true_probabilities:
        return 0.0
    return -sum(math.log(max(p, 1e-15)) for p in true_probabilities) / len(true_probabilities)


class Client:
    def __init__(self, url: str, timeout: float) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)

    def decide(self, body: dict[str, Any]) -> dict[str, Any]:
        self.conn.request("POST", "/v1/systemone", json.dumps(body), {"content-type": "application/json"})
        response = self.conn.getresponse()
        payload = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload}")
        return payload


def request(item: Item, order: tuple[str, ...], mode: str, salt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "state": item.state,
        "instructions": INSTRUCTIONS,
        "cache_salt": salt,
        "questions": {"q": {"type": "choice", "instructions": item.question, "criteria": dict.fromkeys(order)}},
    }
    if mode != "plain":
        body["x_debias"] = mode
    return body


def run_mode(client: Client, mode: str, salt: str, items: tuple[Item, ...]) -> dict[str, Any]:
    choices: list[list[str]] = []
    confidences: list[float] = []
    correct: list[bool] = []
    truths: list[float] = []
    sensitivity: list[float] = []
    tokens = 0
    reads = 0
    started = time.perf_counter()
    for item in items:
        per_item = []
        for order in orders(item.options):
            payload = client.decide(request(item, order, mode, salt))
            answer = payload["answers"]["q"]
            p = answer["probabilities"]
            per_item.append(answer["choice"])
            confidences.append(p[answer["choice"]])
            correct.append(answer["choice"] == item.answer)
            truths.append(p[item.answer])
            diagnostics = payload.get("x_diagnostics", {}).get("q", {})
            if "order_sensitivity" in diagnostics:
                sensitivity.append(diagnostics["order_sensitivity"])
            tokens += payload["usage"]["input_tokens"]
            reads += 1
        choices.append(per_item)
    seconds = time.perf_counter() - started
    return {
        "mode": mode,
        "items": len(items),
        "reads": reads,
        "accuracy": sum(correct) / len(correct),
        "flip_rate": flip_rate(choices),
        "disagreement": disagreement(choices),
        "ece": ece(confidences, correct),
        "log_loss": log_loss(truths),
        "mean_order_sensitivity": sum(sensitivity) / len(sensitivity) if sensitivity else None,
        "questions_per_s": reads / seconds,
        "prompt_tokens_per_question": tokens / reads,
    }


def repeat_floor(client: Client, salt: str, items: tuple[Item, ...]) -> float:
    """Flip rate between two plain reads of every item in every order: the server's own repeat noise."""
    flips = 0
    total = 0
    for item in items:
        for order in orders(item.options):
            first = client.decide(request(item, order, "plain", salt))["answers"]["q"]["choice"]
            again = client.decide(request(item, order, "plain", salt + "-again"))["answers"]["q"]["choice"]
            flips += first != again
            total += 1
    return flips / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="decision_bench.order_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--modes", default=",".join(MODES), help="Comma list of plain, rotate, prior, off")
    parser.add_argument(
        "--max-options", type=int, default=4, help="Only items with at most this many options (3: 6 orders each)"
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args(argv)
    client = Client(args.url, args.timeout)
    salt = f"order-quality-{time.time_ns()}"
    items = tuple(item for item in ITEMS if len(item.options) <= args.max_options)
    report: dict[str, Any] = {"items": len(items), "orders_per_item": "all n! (3 or 4 options: 6 or 24)"}
    report["repeat_noise_flip_rate"] = repeat_floor(client, salt, items)
    report["modes"] = []
    for mode in args.modes.split(","):
        result = run_mode(client, mode, salt, items)
        report["modes"].append(result)
        print(json.dumps(result), file=sys.stderr)
    text = json.dumps(report, indent=1)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
