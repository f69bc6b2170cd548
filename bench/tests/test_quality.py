"""decision-quality: its labelled sets (files = generator, schema, one signature per set), its measures on synthetic
reads (flip rate, noise floor, ECE, log-loss, reliability) and a whole run against a fake server with a planted
position bias (plain flips, rotate does not; the calibrated mode posts the fit split and names its fit)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from decision_bench import quality, quality_sets
from decision_bench.order_quality import ece, reliability
from decision_bench.quality import ModeRun, Read, noise_floor, read_answer, summarize
from decision_bench.quality_sets import DATA_DIR, Item, build_sets, fit_split, load, validate


def test_the_data_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    written = quality_sets.write(tmp_path)
    for path in written:
        assert path.read_bytes() == (DATA_DIR / path.name).read_bytes(), f"{path.name}: rerun quality_sets --write"
    assert sorted(p.name for p in DATA_DIR.iterdir() if p.suffix in (".jsonl", ".json")) == sorted(
        p.name for p in written
    )


def test_the_sets_load_validated_with_a_few_hundred_items_and_their_provenance() -> None:
    sets = load()
    assert sum(len(s.items) for s in sets) >= 400
    kinds = {s.kind for s in sets}
    assert kinds == {"choice", "noul", "score"}
    ids = [i.id for s in sets for i in s.items]
    assert len(ids) == len(set(ids))
    for labelled in sets:
        assert labelled.measures and labelled.provenance
        assert len(labelled.items) >= 40, labelled.name
        # One question and one label set per set: the prior and the calibration fit learn one signature from it.
        assert len({(i.question, i.options) for i in labelled.items}) == 1, labelled.name
        answers = [json.dumps(i.answer) for i in labelled.items]
        # No set is answered by always picking one label.
        assert max(answers.count(a) for a in set(answers)) / len(answers) <= 0.55, labelled.name
    most = next(s for s in sets if s.name == "most")
    assert len({i.names for i in most.items}) == 1
    for item in most.items:
        counts = {
            name: int(part.split(" has ")[1].split()[0])
            for part in item.state.rstrip(".").replace(" and ", ", ").split(", ")
            for name in [part.split(" has ")[0]]
        }
        assert item.answer == max(counts, key=lambda k: counts[k]), item


def test_the_manifest_states_each_sets_licence_and_what_it_measures() -> None:
    manifest = json.loads((DATA_DIR / "sets.json").read_text())["sets"]
    assert {e["name"] for e in manifest} == {s.name for s in build_sets()}
    for entry in manifest:
        assert entry["licence"] == "Apache-2.0" and entry["measures"] and entry["provenance"]


def choice(answer: Any = "a", names: tuple[str, ...] = ("a", "b", "c")) -> Item:
    return Item("s", "s-001", "choice", "text", "q?", tuple((n, None) for n in names), answer)


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (choice(names=("a", "b")), "3-4 options"),
        (choice(names=("a", "b", "c", "d", "e")), "3-4 options"),
        (choice(answer="z"), "is not an option"),
        (choice(names=("a", "a", "b")), "repeated option names"),
        (Item("s", "s-1", "noul", "t", "q?", (("x", None),), True), "no options"),
        (Item("s", "s-1", "noul", "t", "q?", (), "yes"), "true/false"),
        (Item("s", "s-1", "score", "t", "q?", (("lo", None), ("hi", None)), 2), "level index"),
        (Item("s", "s-1", "score", "t", "q?", (("lo", None), ("hi", None)), True), "level index"),
        (Item("s", "s-1", "score", "t", "q?", (("lo", None),), 0), "2-10 levels"),
        (Item("s", "s-1", "rank", "t", "q?", (), 0), "is not one of"),
        (Item("s", "s-1", "noul", " ", "q?", (), True), "empty state"),
    ],
)
def test_validate_refuses_each_broken_item_naming_it(item: Item, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate(item)


def test_load_refuses_an_unknown_set_and_a_file_that_disagrees_with_its_manifest(tmp_path: Path) -> None:
    quality_sets.write(tmp_path)
    with pytest.raises(ValueError, match=r"--sets: no set named \['nope'\]"):
        load(tmp_path, ["tickets", "nope"])
    assert [s.name for s in load(tmp_path, ["even", "tickets"])] == ["even", "tickets"]
    (tmp_path / "even.jsonl").write_text((tmp_path / "tickets.jsonl").read_text())
    with pytest.raises(ValueError, match=r"disagree with sets\.json's 'even'"):
        load(tmp_path, ["even"])


def test_the_fit_split_is_stable_disjoint_and_near_its_fraction() -> None:
    items = [i for s in load() for i in s.items]
    fitted = [i for i in items if fit_split(i.id, 0.4)]
    assert [i.id for i in fitted] == [i.id for i in items if fit_split(i.id, 0.4)]
    assert 0.3 < len(fitted) / len(items) < 0.5
    assert all(fit_split(i.id, 0.5) for i in fitted)  # a larger fraction keeps the smaller one's items


def test_read_answer_per_type() -> None:
    item = choice(answer="b")
    assert read_answer(item, {"choice": "a", "probabilities": {"a": 0.7, "b": 0.2, "c": 0.1}}) == ("a", 0.7, 0.2)
    yes = Item("s", "s-1", "noul", "t", "q?", (), False)
    assert read_answer(yes, {"noul": 0.8}) == ("true", 0.8, pytest.approx(0.2))
    assert read_answer(yes, {"noul": 0.3}) == ("false", 0.7, 0.7)
    score = Item("s", "s-1", "score", "t", "q?", (("lo", None), ("mid", None), ("hi", None)), 2)
    assert read_answer(score, {"probabilities": {"0": 0.2, "1": 0.5, "2": 0.3}}) == ("1", 0.5, 0.3)


def r(item: str, order: str, chosen: str, confidence: float, answer: str = "a") -> Read:
    return Read(item, tuple(order), chosen, confidence, confidence if chosen == answer else 0.1, chosen == answer)


def test_summary_of_synthetic_reads() -> None:
    reads = [
        r("x", "abc", "a", 0.9),
        r("x", "bca", "b", 0.6),  # x flips, b chosen where it was listed first
        r("y", "abc", "a", 0.8),
        r("y", "cab", "a", 0.8),
    ]
    summary = summarize(ModeRun(reads, seconds=2.0, input_tokens=100, requests=2), "choice")
    assert summary["flip_rate"] == 0.5
    assert summary["disagreement"] == 1 / 4
    assert summary["accuracy"] == 0.75
    assert summary["chosen_position"] == {0: 3, 1: 1}
    assert summary["questions_per_s"] == 2.0 and summary["input_tokens_per_request"] == 50
    assert math.isclose(summary["log_loss"], -(math.log(0.9) + math.log(0.1) + 2 * math.log(0.8)) / 4)
    assert math.isclose(summary["ece"], ece([0.9, 0.6, 0.8, 0.8], [True, False, True, True]))


def test_noise_floor_counts_items_and_reads_that_changed_and_refuses_other_reads() -> None:
    first = [r("x", "abc", "a", 0.5), r("x", "bca", "a", 0.5), r("y", "abc", "b", 0.9)]
    again = [r("x", "abc", "b", 0.52), r("x", "bca", "a", 0.5), r("y", "abc", "b", 0.9)]
    floor = noise_floor(first, again)
    assert floor["flip_rate"] == 0.5 and floor["read_changes"] == 1 / 3
    assert math.isclose(floor["max_abs_confidence_change"], 0.02)
    assert noise_floor(first, first)["flip_rate"] == 0.0
    with pytest.raises(ValueError, match="same items in the same orders"):
        noise_floor(first, again[::-1])


def test_reliability_bins_are_what_ece_weighs() -> None:
    confidences = [0.95, 0.91, 0.55, 0.52, 0.34]
    correct = [True, False, True, True, False]
    bins = reliability(confidences, correct)
    assert [(b["lo"], b["n"]) for b in bins] == [(0.3, 1), (0.5, 2), (0.9, 2)]
    assert math.isclose(bins[2]["accuracy"], 0.5) and math.isclose(bins[2]["confidence"], 0.93)
    assert math.isclose(ece(confidences, correct), sum(b["n"] / 5 * abs(b["accuracy"] - b["confidence"]) for b in bins))


class FakeServer(BaseHTTPRequestHandler):
    """A decision server with a planted position bias: plain reads give the option listed first 0.6; `rotate` and
    `prior` answer by name (the right answer 0.5, whatever the order); a calibration names its fit."""

    bodies: list[dict[str, Any]] = []  # noqa: RUF012

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, payload: Any) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        self._send(200, {"model_id": "fake/Model-1"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        FakeServer.bodies.append({"path": self.path, **body})
        if self.path == "/v1/calibrations":
            self._send(201, {"id": "fit-1", "name": body["name"], "n": len(body["examples"]), "signatures": []})
            return
        answers, diagnostics = {}, {}
        for qid, q in body["questions"].items():
            if q["type"] == "choice":
                names = list(q["criteria"])
                if body["x_debias"] == "off":
                    p = {n: (0.6 if i == 0 else 0.4 / (len(names) - 1)) for i, n in enumerate(names)}
                else:
                    p = {n: (0.5 if n == "b" else 0.5 / (len(names) - 1)) for n in names}
                    if body["x_debias"] == "prior":
                        diagnostics[qid] = {"debias": "prior", "prior_samples": 8}
                    else:
                        diagnostics[qid] = {"debias": "rotate", "order_sensitivity": 0.25}
                answers[qid] = {"type": "choice", "choice": max(p, key=lambda n: p[n]), "probabilities": p}
            elif q["type"] == "noul":
                answers[qid] = {"type": "noul", "noul": 0.9}
            else:
                answers[qid] = {"type": "score", "score": 1.0, "probabilities": {"0": 0.1, "1": 0.8, "2": 0.1}}
            if "x_calibration" in body:
                diagnostics.setdefault(qid, {})["calibration"] = {"id": body["x_calibration"], "signature": "sig"}
        self._send(200, {"answers": answers, "x_diagnostics": diagnostics, "usage": {"input_tokens": 10}})


@pytest.fixture
def fake_url() -> Iterator[str]:
    FakeServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def tiny_sets(directory: Path) -> Path:
    directory.mkdir()
    rows = [
        {
            "set": "pick",
            "id": f"pick-{k}",
            "type": "choice",
            "state": f"text {k}",
            "question": "Which?",
            "options": {"a": None, "b": None, "c": None, "d": None},
            "answer": "b",
        }
        for k in range(6)
    ]
    yes = [
        {"set": "yes", "id": f"yes-{k}", "type": "noul", "state": f"t{k}", "question": "True?", "answer": k % 2 == 0}
        for k in range(4)
    ]
    (directory / "pick.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows))
    (directory / "yes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in yes))
    manifest = [
        {
            "name": "pick",
            "type": "choice",
            "items": 6,
            "measures": "m",
            "provenance": "p",
            "licence": "x",
            "file": "pick.jsonl",
        },
        {
            "name": "yes",
            "type": "noul",
            "items": 4,
            "measures": "m",
            "provenance": "p",
            "licence": "x",
            "file": "yes.jsonl",
        },
    ]
    (directory / "sets.json").write_text(json.dumps({"sets": manifest}))
    return directory


def test_a_whole_run_against_a_server_with_a_planted_position_bias(fake_url: str, tmp_path: Path) -> None:
    data = tiny_sets(tmp_path / "data")
    out = tmp_path / "out"
    assert quality.main(["--url", fake_url, "--out", str(out), "--data", str(data), "--fit-fraction", "0.5"]) == 0
    report = json.loads((out / "quality.json").read_text())
    pick = report["sets"][0]
    n_eval = pick["eval_items"]
    assert n_eval + pick["fit_items"] == 6 and n_eval > 0
    plain, rotate, prior, calibrated = (pick["modes"][m] for m in quality.MODES)
    # Plain: the first-listed option always wins, so every item flips over its 24 orders and is right 1/4 of the time.
    assert plain["reads"] == 24 * n_eval and plain["flip_rate"] == 1.0
    assert plain["accuracy"] == 0.25 and plain["chosen_position"] == {"0": 24 * n_eval}
    assert math.isclose(plain["ece"], 0.6 - 0.25)
    assert rotate["flip_rate"] == 0.0 and rotate["accuracy"] == 1.0 and prior["flip_rate"] == 0.0
    assert rotate["mean_order_sensitivity"] == 0.25
    assert prior["prior_corrected"] == 1.0 and rotate["prior_corrected"] == 0.0
    assert pick["repeat_noise"]["flip_rate"] == 0.0
    assert calibrated["calibration_reports"] == {json.dumps({"id": "fit-1", "signature": "sig"}): 24 * n_eval}
    assert pick["calibration"]["id"] == "fit-1"
    yes = report["sets"][1]
    assert "flip_rate" not in yes["modes"]["plain"] and yes["modes"]["plain"]["reads"] == yes["eval_items"]
    assert report["model"] == "fake/Model-1"
    # What went over the wire: one request per item with all its orders, x_debias per mode, x_calibration only when
    # calibrated, and the fit split (each choice in its 4 rotations) posted once per set.
    posts = [b for b in FakeServer.bodies if b["path"] == "/v1/systemone" and b["state"].startswith("text")]
    assert {len(b["questions"]) for b in posts} == {24}
    assert {b["x_debias"] for b in posts} == {"off", "rotate", "prior"}
    assert all(
        ("x_calibration" in b) == (b["x_debias"] == "off" and b["cache_salt"].endswith("calibrated")) for b in posts
    )
    fits = [b for b in FakeServer.bodies if b["path"] == "/v1/calibrations"]
    assert [f["name"] for f in fits] == ["quality-pick", "quality-yes"]
    assert len(fits[0]["examples"]) == 4 * pick["fit_items"] and len(fits[1]["examples"]) == yes["fit_items"]
    example = fits[0]["examples"][0]
    assert set(example) == {"state", "instructions", "questions", "answers"} and example["answers"] == {"q": "b"}
    assert (out / "quality.md").read_text().count("| pick (") == 4
    assert {p.name for p in out.glob("*.png")} == {"reliability.png", "reliability-per-set.png", "flip-rates.png"}
    assert all(p.stat().st_size > 5000 for p in out.glob("*.png"))


def test_the_cli_refuses_unknown_modes_and_fractions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in (
        (["--modes", "plain,shuffle"], "--modes: unknown ['shuffle']"),
        (["--fit-fraction", "1.5"], "--fit-fraction must be between 0 and 1"),
        (["--sets", "nope"], "--sets: no set named"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            quality.main(["--url", "http://127.0.0.1:9", "--out", str(tmp_path), *args])
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err


def test_eval_split_caps_reads_per_set_and_keeps_out_the_fit_items() -> None:
    sets = {s.name: s for s in load()}
    four = quality.eval_split(sets["tickets"], 0.4, "all", 300)
    assert len(four) == 300 // 24 and not any(fit_split(i.id, 0.4) for i in four)
    assert len(quality.eval_split(sets["tickets"], 0.4, "cyclic", 300)) > len(four)
    assert len(quality.eval_split(sets["sentiment"], 0.4, "all", 300)) == min(
        300 // 6, 60 - sum(fit_split(i.id, 0.4) for i in sets["sentiment"].items)
    )
    everything = quality.eval_split(sets["even"], 0.4, "all", None)
    assert len(everything) == sum(not fit_split(i.id, 0.4) for i in sets["even"].items)
    # The first items of a set take each label in turn, so a capped split is not all one answer.
    assert len({i.answer for i in four}) == 4


def test_merge_adds_a_later_runs_modes_and_refuses_another_split() -> None:
    old = {
        "orders": "all",
        "fit_fraction": 0.4,
        "max_reads_per_set": 300,
        "sets": [{"name": "pick", "eval_items": 3, "modes": {"plain": {"accuracy": 0.5}}}],
    }
    new = {
        "orders": "all",
        "fit_fraction": 0.4,
        "max_reads_per_set": 300,
        "command": "decision-quality --modes c",
        "sets": [
            {
                "name": "pick",
                "eval_items": 3,
                "modes": {"calibrated": {"accuracy": 0.7}},
                "calibration": {"id": "fit-1"},
            }
        ],
    }
    merged = quality.merge(json.loads(json.dumps(old)), new)
    assert merged["sets"][0]["modes"] == {"plain": {"accuracy": 0.5}, "calibrated": {"accuracy": 0.7}}
    assert merged["sets"][0]["calibration"] == {"id": "fit-1"} and merged["merged_commands"] == [new["command"]]
    with pytest.raises(ValueError, match="max_reads_per_set differs"):
        quality.merge(json.loads(json.dumps(old)), {**new, "max_reads_per_set": 100})
    other = json.loads(json.dumps(new))
    other["sets"][0]["eval_items"] = 4
    with pytest.raises(ValueError, match="set 'pick' has 3 eval items there"):
        quality.merge(json.loads(json.dumps(old)), other)


def test_a_later_calibrated_run_merges_into_the_first_report(fake_url: str, tmp_path: Path) -> None:
    data = tiny_sets(tmp_path / "data")
    first, second = tmp_path / "first", tmp_path / "second"
    base = ["--url", fake_url, "--data", str(data), "--fit-fraction", "0.5", "--no-plots"]
    assert quality.main([*base, "--out", str(first), "--modes", "plain,rotate"]) == 0
    assert (
        quality.main(
            [
                *base,
                "--out",
                str(second),
                "--modes",
                "calibrated",
                "--no-repeat",
                "--merge-into",
                str(first / "quality.json"),
            ]
        )
        == 0
    )
    merged = json.loads((second / "quality.json").read_text())
    assert list(merged["sets"][0]["modes"]) == ["plain", "rotate", "calibrated"]
    assert merged["sets"][0]["repeat_noise"]["flip_rate"] == 0.0 and merged["sets"][0]["calibration"]["id"] == "fit-1"
    assert (
        quality.main(
            [
                *base,
                "--out",
                str(second),
                "--orders",
                "cyclic",
                "--modes",
                "calibrated",
                "--merge-into",
                str(first / "quality.json"),
            ]
        )
        == 1
    )


def test_the_markdown_table_has_a_row_per_set_and_mode_and_says_what_did_not_run() -> None:
    report = {
        "sets": [
            {
                "name": "pick",
                "type": "choice",
                "eval_items": 2,
                "repeat_noise": {"flip_rate": 0.0},
                "modes": {
                    "plain": {
                        "accuracy": 0.5,
                        "flip_rate": 1.0,
                        "disagreement": 0.25,
                        "ece": 0.1,
                        "log_loss": 1.2,
                        "mean_order_sensitivity": None,
                        "prior_corrected": 0.0,
                        "questions_per_s": 3.0,
                    },
                    "calibrated": {"error": "POST /v1/calibrations: 404: not found"},
                },
            },
        ]
    }
    table = quality.markdown(report).splitlines()
    assert len(table) == 4 and all(line.count("|") == 11 for line in table)
    assert "| pick (2, choice) | plain | 0.500 | 1.000 (0.000) | 0.250 | 0.100 | 1.200 | - | 0.00 | 3.00 |" in table
    assert table[3].startswith("| pick (2) | calibrated | not run: POST /v1/calibrations: 404")
