"""Canvas reads (DiffusionGemma block diffusion) through the real gRPC server equal transformers' own
`DiffusionGemmaForBlockDiffusion` forward on the same prompt and canvas, softcapping included; repeats are
bit-identical, batches equal reads run alone, and every malformed read is refused before any tensor work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from conftest import running_shard

from decision_server.architectures import EngineRefusedError, choose_engine
from decision_server.engines import CanvasEngine, make_engine
from decision_server.fixtures import make_fixture
from decision_server.model import LoadedModel, LoadOptions, load_model
from decision_server.paths import fixture_dir
from decision_server.pb import decision_pb2

FIXTURE = "tiny-diffusiongemma"
THOUGHT = "<|channel>thought\n<channel|>"
LABELS = ("A", "B", "C", "yes", "no", "0", "1", "2", "9")


@pytest.fixture(scope="module")
def diffusion_dir() -> Path:
    out = fixture_dir(FIXTURE, 0)
    make_fixture(FIXTURE, out, seed=0)
    return out


@pytest.fixture(scope="module")
def diffusion(diffusion_dir: Path) -> LoadedModel:
    return load_model(diffusion_dir, LoadOptions(dtype="float32"))


def reference_model(path: Path) -> Any:
    from transformers import DiffusionGemmaForBlockDiffusion

    # Loaded on its own, with transformers' defaults: the shard is checked against an independent computation.
    return DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def reference(diffusion_dir: Path) -> Any:
    return reference_model(diffusion_dir)


@pytest.fixture(scope="module")
def tokenizer(diffusion_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(diffusion_dir)


def reference_logprobs(reference: Any, prompt: list[int], canvas: list[int]) -> torch.Tensor:
    """(canvas, vocab) full-vocabulary log-probabilities of one plain forward: the prompt through the encoder, the
    canvas through the decoder, LM head and softcap as the model's own `forward` does (log-softmax in float64)."""
    with torch.inference_mode():
        output = reference(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([canvas]))
    return torch.log_softmax(output.logits[0].double(), dim=-1)


def prompt_ids(tokenizer: Any, state: str, question: str) -> list[int]:
    """A rendered chat prompt with the thought block appended, as the router sends it."""
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": f"{state}\n\n{question}"}],
        add_generation_prompt=True,
        tokenize=False,
        enable_thinking=False,
    )
    ids: list[int] = tokenizer.encode(text + THOUGHT, add_special_tokens=False)
    return ids


def token(tokenizer: Any, text: str) -> int:
    (only,) = tokenizer.encode(text, add_special_tokens=False)
    return int(only)


def single_canvas(tokenizer: Any, noise: int) -> list[int]:
    return [noise, token(tokenizer, "<turn|>"), *[tokenizer.pad_token_id] * 14]


def canvas_read(
    read_id: int, prompt: list[int], canvas: list[int], rows: list[tuple[int, list[list[int]]]], salt: str = ""
) -> decision_pb2.Read:
    return decision_pb2.Read(
        id=read_id,
        cache_salt=salt,
        canvas=decision_pb2.CanvasRead(
            prompt_ids=prompt,
            canvas_ids=canvas,
            rows=[
                decision_pb2.CanvasRow(
                    position=position,
                    labels=[
                        decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=[v]) for v in group])
                        for group in groups
                    ],
                )
                for position, groups in rows
            ],
        ),
    )


def row_values(result: decision_pb2.ReadResult) -> list[list[float]]:
    return [[value for group in row.labels for value in group.variant_logprobs] for row in result.canvas.rows]


STATES = (
    "The customer says the refund never arrived and asks for the money back.",
    '{"ticket": "Refund not received", "days": 12}' * 12,  # longer than the sliding window of 64
)
QUESTION = "Question: Is it urgent?\nyes\nno\nAnswer with yes or no only."


@pytest.fixture(scope="module")
def stub(diffusion: LoadedModel) -> Iterator[Any]:
    with running_shard(diffusion, make_engine("auto", diffusion)) as live:
        yield live


def test_the_architecture_picks_the_canvas_engine(diffusion: LoadedModel, stub: Any) -> None:
    assert choose_engine("auto", diffusion.architecture, diffusion.text_config) == "canvas"
    for mode in ("tree", "fork", "naive"):
        with pytest.raises(EngineRefusedError, match="block-diffusion model"):
            choose_engine(mode, diffusion.architecture, diffusion.text_config)
    assert stub.Info(decision_pb2.InfoRequest()).engine == "canvas"
    assert stub.Info(decision_pb2.InfoRequest()).implementation == "transformers"
    assert stub.Info(decision_pb2.InfoRequest()).read_kind == "canvas"


def test_slot_0_equals_the_model_forward(stub: Any, reference: Any, tokenizer: Any) -> None:
    labels = [token(tokenizer, text) for text in LABELS]
    for read_id, state in enumerate(STATES):
        prompt = prompt_ids(tokenizer, state, QUESTION)
        canvas = single_canvas(tokenizer, noise=100 + read_id)
        response = stub.Read(
            decision_pb2.ReadRequest(reads=[canvas_read(read_id, prompt, canvas, [(0, [[t] for t in labels])])])
        )
        (result,) = response.results
        expected = reference_logprobs(reference, prompt, canvas)
        (values,) = row_values(result)
        assert len(values) == len(labels)
        for label, value in zip(labels, values, strict=True):
            assert value == pytest.approx(float(expected[0, label]), abs=1e-5)
        assert result.canvas.rows[0].greedy_token_id == int(expected[0].argmax())
        assert result.tokens_computed == len(prompt)
        assert response.forward_micros > 0


def test_joint_rows_equal_the_model_forward(stub: Any, reference: Any, tokenizer: Any) -> None:
    """Several rows of one canvas, each with groups of two variants (a label with and without its space)."""
    prompt = prompt_ids(tokenizer, STATES[1], "Question 1: Urgent?\nyes\nno\n\nQuestion 2: Team?\nA: billing\nB: tech")
    line = tokenizer.encode("1: ", add_special_tokens=False)[:2]
    newline = token(tokenizer, "\n")
    canvas = [*line, 301, newline, *tokenizer.encode("2:", add_special_tokens=False), 302, newline]
    canvas += [token(tokenizer, "<turn|>")]
    canvas += [tokenizer.pad_token_id] * (32 - len(canvas))
    yes_no = [[token(tokenizer, "▁yes"), token(tokenizer, "yes")], [token(tokenizer, "▁no"), token(tokenizer, "no")]]
    letters = [[token(tokenizer, "▁A"), token(tokenizer, "A")], [token(tokenizer, "▁B"), token(tokenizer, "B")]]
    rows = [(2, yes_no), (6, letters)]
    (result,) = stub.Read(decision_pb2.ReadRequest(reads=[canvas_read(3, prompt, canvas, rows)])).results
    expected = reference_logprobs(reference, prompt, canvas)
    for (position, groups), got, row in zip(rows, row_values(result), result.canvas.rows, strict=True):
        flat = [variant for group in groups for variant in group]
        assert got == pytest.approx([float(expected[position, t]) for t in flat], abs=1e-5)
        assert row.greedy_token_id == int(expected[position].argmax())
        assert [len(group.variant_logprobs) for group in row.labels] == [2, 2]


def test_repeats_are_bit_identical_and_batches_equal_reads_alone(stub: Any, tokenizer: Any) -> None:
    labels = [[token(tokenizer, text)] for text in LABELS]
    prompts = [prompt_ids(tokenizer, state, QUESTION) for state in STATES]
    reads = [
        canvas_read(0, prompts[0], single_canvas(tokenizer, 111), [(0, labels)]),
        canvas_read(1, prompts[1], single_canvas(tokenizer, 112), [(0, labels)]),
        # Same prompt as read 0, another canvas: one encoder pass serves both, one batched step.
        canvas_read(2, prompts[0], single_canvas(tokenizer, 113), [(0, labels)]),
        # Same prompt again but another salt: never shares the encoder pass.
        canvas_read(3, prompts[0], single_canvas(tokenizer, 111), [(0, labels)], salt="other"),
    ]
    first = stub.Read(decision_pb2.ReadRequest(reads=reads))
    again = stub.Read(decision_pb2.ReadRequest(reads=reads))
    assert [row_values(r) for r in first.results] == [row_values(r) for r in again.results]  # exact equality
    alone = [stub.Read(decision_pb2.ReadRequest(reads=[read])).results[0] for read in reads]
    for batched, single in zip(first.results, alone, strict=True):
        assert batched.id == single.id
        assert row_values(batched)[0] == pytest.approx(row_values(single)[0], abs=1e-6)
    assert row_values(first.results[3])[0] == pytest.approx(row_values(first.results[0])[0], abs=1e-6)
    assert [r.tokens_computed for r in first.results] == [len(prompts[0]), len(prompts[1]), 0, len(prompts[0])]


def test_softcapping_is_applied(diffusion_dir: Path, tokenizer: Any) -> None:
    """Random weights give logits far below the cap of 30; with the final norm scaled up they exceed it, and only a
    softcapped computation matches the model's own forward."""
    model = load_model(diffusion_dir, LoadOptions(dtype="float32"))
    reference = reference_model(diffusion_dir)
    for module in (model.module, reference):  # type: ignore[attr-defined]
        with torch.no_grad():
            module.model.decoder.norm.weight.mul_(400.0)
    prompt = prompt_ids(tokenizer, STATES[0], QUESTION)
    canvas = single_canvas(tokenizer, 150)
    labels = [token(tokenizer, text) for text in LABELS]
    with torch.inference_mode():
        raw = reference(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([canvas]))
        hidden = reference.model(input_ids=torch.tensor([prompt]), decoder_input_ids=torch.tensor([canvas]))
        uncapped = torch.log_softmax(reference.lm_head(hidden.last_hidden_state)[0].double(), dim=-1)
    assert float(raw.logits.abs().max()) > 25.0
    expected = torch.log_softmax(raw.logits[0].double(), dim=-1)
    with running_shard(model, CanvasEngine(model)) as live:
        (result,) = live.Read(
            decision_pb2.ReadRequest(reads=[canvas_read(0, prompt, canvas, [(0, [[t] for t in labels])])])
        ).results
    (values,) = row_values(result)
    assert values == pytest.approx([float(expected[0, t]) for t in labels], abs=1e-5)
    assert max(abs(v - float(uncapped[0, t])) for v, t in zip(values, labels, strict=True)) > 1e-2


def test_malformed_canvas_reads_are_refused_naming_the_problem(
    stub: Any, diffusion: LoadedModel, tokenizer: Any
) -> None:
    prompt = prompt_ids(tokenizer, STATES[0], QUESTION)
    canvas = single_canvas(tokenizer, 100)
    good_rows: list[tuple[int, list[list[int]]]] = [(0, [[token(tokenizer, "yes")], [token(tokenizer, "no")]])]
    too_long = [1] * (diffusion.max_position_embeddings - len(canvas) + 1)
    multi = decision_pb2.Read(
        id=9,
        canvas=decision_pb2.CanvasRead(
            prompt_ids=prompt,
            canvas_ids=canvas,
            rows=[
                decision_pb2.CanvasRow(
                    position=0,
                    labels=[decision_pb2.LabelGroup(variants=[decision_pb2.LabelSequence(token_ids=[5, 6])])],
                )
            ],
        ),
    )
    cases = [
        (canvas_read(1, too_long, canvas, good_rows), "plus a canvas of 16 exceeds max_position_embeddings"),
        (canvas_read(2, prompt, canvas, [(16, good_rows[0][1])]), "row 0: position 16 is outside the canvas of 16"),
        (canvas_read(3, prompt, canvas, []), "canvas read has no rows"),
        (canvas_read(4, [], canvas, good_rows), "prompt has no tokens"),
        (canvas_read(5, prompt, [], good_rows), "canvas has no tokens"),
        (canvas_read(6, prompt, [*canvas[:-1], diffusion.token_limit], good_rows), "canvas token id"),
        (canvas_read(7, prompt, canvas, [(0, [[diffusion.token_limit]])]), "row 0 label token id"),
        (multi, "variant 0 has 2 tokens; a canvas slot reads exactly one"),
        (
            decision_pb2.Read(id=8, next_token=decision_pb2.NextTokenRead(token_ids=prompt)),
            "read kind next_token is not computed by this shard",
        ),
        (decision_pb2.Read(id=10), "no read kind set; this shard computes canvas reads"),
    ]
    for read, message in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.Read(decision_pb2.ReadRequest(reads=[read]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, message
        assert message in (err.value.details() or ""), (message, err.value.details())


def test_a_causal_shard_refuses_canvas_reads(tiny_qwen3: LoadedModel) -> None:
    read = canvas_read(0, [1, 2, 3], [4] * 16, [(0, [[5]])])
    with running_shard(tiny_qwen3, "tree") as live, pytest.raises(grpc.RpcError) as err:
        live.Read(decision_pb2.ReadRequest(reads=[read]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    expected = "read kind canvas is not computed by this shard (it computes next_token reads)"
    assert expected in (err.value.details() or "")


def test_the_fixture_has_moe_layers_gemma_specials_and_single_token_labels(
    diffusion: LoadedModel, tokenizer: Any
) -> None:
    config = diffusion.text_config
    assert diffusion.architecture == "DiffusionGemmaForBlockDiffusion"
    assert (config.num_experts, config.top_k_experts) == (4, 2)
    assert list(config.layer_types) == ["sliding_attention", "full_attention"]
    assert diffusion.module.config.canvas_length == 64  # type: ignore[attr-defined]
    for special in ("<turn|>", "<|turn>", "<|channel>", "<channel|>", "<pad>"):
        assert token(tokenizer, special) < diffusion.vocab_size
    assert tokenizer.pad_token == "<pad>"
    singles = [token(tokenizer, label) for label in (*(chr(c) for c in range(65, 91)), "yes", "no", *"0123456789")]
    assert len(set(singles)) == len(singles)
    rendered = tokenizer.apply_chat_template(
        [{"role": "system", "content": "ctx"}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert rendered == "<bos><|turn>system\nctx<turn|>\n<|turn>user\nhi<turn|>\n<|turn>model\n"


def test_prompts_that_start_alike_encode_their_shared_head_once(stub: Any, reference: Any, tokenizer: Any) -> None:
    """The questions of a request share the chat head and the state: the encoder runs over that head once and
    continues each prompt from a copy of its cache (causal, so exact), including past the sliding window."""
    labels = [token(tokenizer, text) for text in LABELS]
    questions = [QUESTION, "Question: Which team?\nA: billing\nB: tech\nAnswer with the letter of one option only."]
    prompts = [prompt_ids(tokenizer, STATES[1], question) for question in questions]
    shared = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    assert shared > 64, "the shared head is longer than the sliding window"
    reads = [
        canvas_read(i, prompt, single_canvas(tokenizer, 120 + i), [(0, [[t] for t in labels])])
        for i, prompt in enumerate(prompts)
    ]
    response = stub.Read(decision_pb2.ReadRequest(reads=reads))
    for read, prompt, result in zip(reads, prompts, response.results, strict=True):
        expected = reference_logprobs(reference, prompt, list(read.canvas.canvas_ids))
        (values,) = row_values(result)
        assert values == pytest.approx([float(expected[0, t]) for t in labels], abs=1e-5)
    assert [r.tokens_computed for r in response.results] == [len(prompts[0]), len(prompts[1]) - shared]


def test_shared_head_clusters_keep_salts_apart_and_need_a_long_enough_head() -> None:
    from decision_server.engines.canvas import MIN_SHARED_HEAD, shared_head_clusters

    head = tuple(range(MIN_SHARED_HEAD))
    a, b = ("", (*head, 1, 2)), ("", (*head, 3))
    other_salt = ("s", (*head, 4))
    short = ("", (*head[: MIN_SHARED_HEAD - 1], 9))
    stranger = ("", (500, 501))
    assert shared_head_clusters([b, stranger, a, other_salt, short]) == [[b, a], [stranger], [other_salt], [short]]
