import pytest

from decision_bench.agreement import compare_answers, summarize


def response(**questions: dict[str, float]) -> dict:
    return {"answers": {qid: {"probabilities": probs} for qid, probs in questions.items()}}


def test_a_noul_answer_is_compared_as_true_and_false() -> None:
    (row,) = compare_answers(0, {"answers": {"q": {"noul": 0.75}}}, {"answers": {"q": {"noul": 0.45}}})
    assert not row.agree
    assert row.max_abs_dp == pytest.approx(0.3)
    assert row.reference_margin == pytest.approx(0.5)


def test_questions_agree_when_the_argmax_is_the_same_option() -> None:
    reference = response(team={"billing": 0.6, "tech": 0.3, "other": 0.1}, urgent={"0": 0.45, "1": 0.55})
    candidate = response(team={"billing": 0.5, "tech": 0.4, "other": 0.1}, urgent={"0": 0.55, "1": 0.45})
    team, urgent = compare_answers(3, reference, candidate)
    assert (team.question, team.agree, team.request) == ("team", True, 3)
    assert team.max_abs_dp == pytest.approx(0.1)
    assert team.reference_margin == pytest.approx(0.3)
    assert not urgent.agree
    assert urgent.reference_margin == pytest.approx(0.1)
    summary = summarize([team, urgent])
    assert (summary["questions"], summary["agreeing"], summary["agreement"]) == (2, 1, 0.5)
    assert summary["max_abs_dp"] == pytest.approx(0.1)
    assert [row["question"] for row in summary["disagreements"]] == ["urgent"]


def test_different_options_are_an_error_not_a_disagreement() -> None:
    with pytest.raises(ValueError, match="options differ"):
        compare_answers(0, response(q={"a": 1.0, "b": 0.0}), response(q={"a": 1.0}))
    with pytest.raises(ValueError, match="no questions"):
        summarize([])
