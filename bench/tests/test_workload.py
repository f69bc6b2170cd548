"""The workload is a pure function of the seed: same seed, same bytes; states hit their token target."""

from __future__ import annotations

import json

import pytest

from decision_bench.tokens import CharCounter
from decision_bench.workload import Workload, WorkloadSpec, make_schema, make_state, question_body


def workload(**changes: object) -> Workload:
    fields: dict[str, object] = {"state_tokens": 256, "questions": 8, "options": 4, "seed": 0}
    fields.update(changes)
    return Workload(WorkloadSpec(**fields), CharCounter())  # type: ignore[arg-type]


def test_same_seed_same_requests() -> None:
    first, second = workload(), workload()
    for index in range(5):
        assert first.request(index).body == second.request(index).body


def test_request_does_not_depend_on_call_order() -> None:
    forward = workload()
    backward = workload()
    bodies = [forward.request(index).body for index in range(4)]
    assert [backward.request(index).body for index in reversed(range(4))][::-1] == bodies


def test_other_seed_other_requests() -> None:
    assert workload(seed=0).request(0).body != workload(seed=1).request(0).body


def test_fresh_states_are_distinct_from_their_first_line() -> None:
    bench = workload()
    states = [json.loads(bench.request(index).body)["state"] for index in range(20)]
    assert len(set(states)) == 20
    first_lines = {state.split(".")[0] for state in states}
    assert len(first_lines) == 20
    warm = json.loads(bench.request(0, stream="warmup").body)["state"]
    assert warm not in states


@pytest.mark.parametrize("target", [1, 64, 512, 2048])
def test_state_reaches_its_token_target(target: int) -> None:
    counter = CharCounter()
    text, tokens = make_state(0, "run:0", target, counter)
    assert tokens == counter.count(text)
    assert target <= tokens <= target + 40


def test_schema_follows_mix_and_options() -> None:
    spec = WorkloadSpec(state_tokens=64, questions=7, options=5, mix=("choice", "noul", "score"), levels=3)
    schema = make_schema(spec)
    assert list(schema) == [f"q{i}" for i in range(7)]
    kinds = [question["type"] for question in schema.values()]
    assert kinds == ["choice", "noul", "score", "choice", "noul", "score", "choice"]
    for question in schema.values():
        if question["type"] == "choice":
            assert len(question["criteria"]) == 5
        if question["type"] == "score":
            assert len(question["criteria"]) == 3


def test_many_options_stay_distinct() -> None:
    schema = make_schema(WorkloadSpec(state_tokens=64, questions=1, options=255, mix=("choice",)))
    names = list(schema["q0"]["criteria"])
    assert len(names) == 255
    assert len({name.strip().casefold() for name in names}) == 255


def test_same_schema_for_every_request() -> None:
    bench = workload()
    schemas = {json.dumps(json.loads(bench.request(index).body)["questions"]) for index in range(3)}
    assert len(schemas) == 1


def test_repeat_state_fraction() -> None:
    none = workload(repeat_state_fraction=0.0)
    assert all(not none.request(index).state_key.startswith("hot:") for index in range(50))
    always = workload(repeat_state_fraction=1.0, hot_states=2)
    states = {json.loads(always.request(index).body)["state"] for index in range(50)}
    assert len(states) == 2
    half = workload(repeat_state_fraction=0.5)
    hot = sum(half.request(index).state_key.startswith("hot:") for index in range(400))
    assert 150 < hot < 250


def test_naive_estimate_counts_state_once_per_question() -> None:
    bench = workload(questions=4)
    request = bench.request(0)
    assert request.naive_prompt_tokens > 4 * request.state_tokens
    two = workload(questions=8).request(0)
    assert two.state_tokens == request.state_tokens
    assert two.naive_prompt_tokens > request.naive_prompt_tokens


def test_question_body_wording() -> None:
    body = question_body(
        {"type": "choice", "instructions": "Which team?", "criteria": {"billing": "payments", "tech": None}}
    )
    assert body == "Question: Which team?\nA: billing - payments\nB: tech\nAnswer with the letter of one option only."
    assert question_body({"type": "noul", "instructions": "Urgent?", "criteria": {"true": "money"}}) == (
        "Question: Urgent?\nyes: money\nno\nAnswer with yes or no only."
    )
    assert question_body({"type": "score", "instructions": "Upset?", "criteria": ["calm", "angry"]}) == (
        "Question: Upset?\n0: calm\n1: angry\nAnswer with the number of one level only."
    )


@pytest.mark.parametrize(
    "changes",
    [{"questions": 0}, {"options": 0}, {"options": 256}, {"mix": ("choice", "poll")}, {"repeat_state_fraction": 1.5}],
)
def test_bad_spec_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        workload(**changes)


def test_joint_requests_carry_the_flag_and_others_do_not() -> None:
    import json

    assert json.loads(workload(joint=True).request(0).body)["joint"] is True
    assert "joint" not in json.loads(workload().request(0).body)


def test_a_bad_fraction_mixes_in_every_bad_kind_seeded_and_reported_apart() -> None:
    from decision_bench.report import bad_summary
    from decision_bench.runner import Outcome
    from decision_bench.workload import BAD_KINDS

    bench = workload(bad_fraction=0.3)
    requests = [bench.request(index) for index in range(400)]
    bad = [r for r in requests if r.bad is not None]
    assert 80 <= len(bad) <= 160, len(bad)
    assert {r.bad for r in bad} == set(BAD_KINDS)
    assert [r.body for r in bad] == [
        r.body for r in (workload(bad_fraction=0.3).request(i) for i in range(400)) if r.bad
    ]
    for r in bad:
        if r.bad == "not_json" or r.bad == "truncated":
            with pytest.raises(ValueError):
                json.loads(r.body)
        else:
            json.loads(r.body)
    # Warm-up requests are always valid; a fraction of 0 sends none.
    assert all(bench.request(i, stream="warmup").bad is None for i in range(50))
    assert all(workload().request(i).bad is None for i in range(50))
    summary = bad_summary([Outcome(0, "422", 0.1, bad="unknown_type"), Outcome(1, "500", 0.1, bad="huge_state")])
    assert summary["not_4xx"] == 1 and summary["by_status"] == {"422": 1, "500": 1}
    with pytest.raises(ValueError):
        WorkloadSpec(state_tokens=1, questions=1, options=1, bad_fraction=1.5)
