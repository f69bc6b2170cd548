"""Canvas reads (DiffusionGemma block diffusion) through the real gRPC server equal transformers' own
`DiffusionGemmaForBlockDiffusion` forward on the same prompt and canvas, softcapping included, with images too
(processed by the folder's processor, each image block attended bidirectionally as transformers' `generate` masks
it); repeats are bit-identical, batches equal reads run alone, the questions about one image encode it once, and
every malformed read is refused before any tensor work."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch
from conftest import running_shard
from PIL import Image

from decision_server.architectures import EngineRefusedError, choose_engine
from decision_server.engines import CanvasEngine, make_engine
from decision_server.fixtures import make_fixture
from decision_server.fixtures.media_samples import video_bytes
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


# --- canvases with images -------------------------------------------------------------------------------------


def png(seed: int, width: int = 96, height: int = 64) -> bytes:
    pixels = (np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def media_item(data: bytes, name: str = "images.0") -> decision_pb2.MediaItem:
    modality = decision_pb2.VIDEO if name.startswith("videos") else decision_pb2.IMAGE
    return decision_pb2.MediaItem(modality=modality, data=data, sha256=hashlib.sha256(data).hexdigest(), name=name)


def media_prompt_ids(tokenizer: Any, images: int, user: str) -> list[int]:
    """The prompt as the router renders it for a canvas read with images: one image part per image before the
    user text (the placeholders the processor expands), then the thought block."""
    content = [*({"type": "image"} for _ in range(images)), {"type": "text", "text": user}]
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False, enable_thinking=False
    )
    ids: list[int] = tokenizer.encode(text + THOUGHT, add_special_tokens=False)
    return ids


def with_media(read: decision_pb2.Read, images: list[bytes]) -> decision_pb2.Read:
    read.media.extend(media_item(data, f"images.{index}") for index, data in enumerate(images))
    return read


def reference_media_logprobs(
    reference: Any, folder: Path, prompt: list[int], images: list[bytes], canvas: list[int]
) -> torch.Tensor:
    """An independent forward with images: the folder's processor on the prompt text and the images, the encoder's
    masks built from the token types as transformers' `generate` builds them, the vision tower's features, and
    `DiffusionGemmaForBlockDiffusion`'s own forward over prompt and canvas; (canvas, vocab) log-probabilities."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(folder)
    text = processor.tokenizer.decode(prompt, skip_special_tokens=False)
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    inputs = processor(images=pil, text=[text], return_tensors="pt", add_special_tokens=False)
    encoder = reference.model.encoder
    ids = inputs["input_ids"]
    masks = encoder.create_masks_for_generate(
        config=reference.config,
        inputs_embeds=torch.empty((1, ids.shape[1], 0)),
        attention_mask=inputs["attention_mask"],
        cache=None,
        position_ids=None,
        mm_token_type_ids=inputs["mm_token_type_ids"],
    )
    with torch.inference_mode():
        features = encoder.get_image_features(inputs["pixel_values"], inputs["image_position_ids"], return_dict=True)
        output = reference(
            input_ids=ids,
            attention_mask=masks,
            decoder_input_ids=torch.tensor([canvas]),
            mm_encoder_outputs={"image": features},
        )
    return torch.log_softmax(output.logits[0].double(), dim=-1)


def test_canvas_reads_with_images_equal_the_model_forward(
    stub: Any, reference: Any, diffusion_dir: Path, tokenizer: Any
) -> None:
    """Two images of different sizes before the state: each image block is attended bidirectionally (a causal
    mask over them gives other values), and the read equals the model's own forward within 1e-5."""
    info = stub.Info(decision_pb2.InfoRequest())
    assert list(info.modalities) == [decision_pb2.IMAGE]
    labels = [token(tokenizer, text) for text in LABELS]
    prompt = media_prompt_ids(tokenizer, 2, f"{STATES[0]}\n\n{QUESTION}")
    images = [png(1), png(2, 40, 120)]
    canvas = single_canvas(tokenizer, 131)
    read = with_media(canvas_read(0, prompt, canvas, [(0, [[t] for t in labels])]), images)
    (result,) = stub.Read(decision_pb2.ReadRequest(reads=[read])).results
    assert result.media_error == ""
    expected = reference_media_logprobs(reference, diffusion_dir, prompt, images, canvas)
    (values,) = row_values(result)
    assert values == pytest.approx([float(expected[0, t]) for t in labels], abs=1e-5)
    assert result.canvas.rows[0].greedy_token_id == int(expected[0].argmax())
    assert result.media_tokens > 0 and result.tokens_computed == len(prompt) + result.media_tokens
    # The bidirectional image blocks matter: a plain causal encoder over the same inputs reads differently.
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(diffusion_dir)
    pil = [Image.open(io.BytesIO(data)).convert("RGB") for data in images]
    text = tokenizer.decode(prompt, skip_special_tokens=False)
    inputs = processor(images=pil, text=[text], return_tensors="pt", add_special_tokens=False)
    encoder = reference.model.encoder
    with torch.inference_mode():
        features = encoder.get_image_features(inputs["pixel_values"], inputs["image_position_ids"], return_dict=True)
        causal = reference(
            input_ids=inputs["input_ids"],
            decoder_input_ids=torch.tensor([canvas]),
            mm_encoder_outputs={"image": features},
        )
    causal_values = torch.log_softmax(causal.logits[0].double(), dim=-1)[0, labels]
    assert max(abs(a - float(b)) for a, b in zip(values, causal_values, strict=True)) > 1e-3


def test_the_questions_about_one_image_encode_it_once(
    diffusion: LoadedModel, reference: Any, diffusion_dir: Path, tokenizer: Any
) -> None:
    """Per-question canvases and a joint canvas about one image (and a read of another image with the same ids):
    the vision tower runs once per distinct image of the batch, the shared head (chat head, image, state) is
    encoded once, and every read still equals the model's own forward over its whole prompt."""
    labels = [token(tokenizer, text) for text in LABELS]
    state = STATES[1]
    users = [
        f"{state}\n\n{QUESTION}",
        f"{state}\n\nQuestion: Which team?\nA: billing\nB: tech\nAnswer with the letter of one option only.",
        f"{state}\n\nQuestion 1: Urgent?\nyes\nno\n\nQuestion 2: Team?\nA: billing\nB: tech",
    ]
    prompts = [media_prompt_ids(tokenizer, 1, user) for user in users]
    newline = token(tokenizer, "\n")
    joint = [*tokenizer.encode("1: ", add_special_tokens=False)[:2], 301, newline]
    joint += [*tokenizer.encode("2:", add_special_tokens=False), 302, newline, token(tokenizer, "<turn|>")]
    joint += [tokenizer.pad_token_id] * (32 - len(joint))
    yes_no = [[token(tokenizer, "▁yes"), token(tokenizer, "yes")], [token(tokenizer, "▁no"), token(tokenizer, "no")]]
    letters = [[token(tokenizer, "▁A"), token(tokenizer, "A")], [token(tokenizer, "▁B"), token(tokenizer, "B")]]
    image, other = png(21, 80, 60), png(22, 80, 60)
    canvases = [single_canvas(tokenizer, 140), single_canvas(tokenizer, 141), joint]
    rows: list[list[tuple[int, list[list[int]]]]] = [
        [(0, [[t] for t in labels])],
        [(0, [[t] for t in labels])],
        [(2, yes_no), (6, letters)],
    ]
    reads = [
        with_media(canvas_read(index, prompt, canvas, row), [image])
        for index, (prompt, canvas, row) in enumerate(zip(prompts, canvases, rows, strict=True))
    ]
    reads.append(with_media(canvas_read(9, prompts[0], canvases[0], rows[0]), [other]))
    inner = diffusion.module.model.encoder  # type: ignore[attr-defined]
    encode = inner.get_image_features
    encodings = 0

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal encodings
        encodings += 1
        return encode(*args, **kwargs)

    inner.get_image_features = counting
    try:
        with running_shard(diffusion, make_engine("auto", diffusion)) as live:
            response = live.Read(decision_pb2.ReadRequest(reads=reads))
            batch_encodings = encodings
            alone = live.Read(decision_pb2.ReadRequest(reads=[reads[3]])).results[0]
    finally:
        del inner.get_image_features
    assert batch_encodings == 2  # one per distinct image, not one per read
    results = list(response.results)
    assert [r.media_error for r in results] == ["", "", "", ""]
    for read_index, (prompt, canvas, row) in enumerate(zip(prompts, canvases, rows, strict=True)):
        expected = reference_media_logprobs(reference, diffusion_dir, prompt, [image], canvas)
        for (position, groups), got in zip(row, row_values(results[read_index]), strict=True):
            flat = [variant for group in groups for variant in group]
            assert got == pytest.approx([float(expected[position, t]) for t in flat], abs=1e-5)
    # Equal ids, another image: its own encoder pass and other values, the same as when read alone.
    assert row_values(results[3]) != row_values(results[0])
    assert row_values(results[3])[0] == pytest.approx(row_values(alone)[0], abs=1e-6)
    expected_other = reference_media_logprobs(reference, diffusion_dir, prompts[0], [other], canvases[0])
    assert row_values(results[3])[0] == pytest.approx([float(expected_other[0, t]) for t in labels], abs=1e-5)
    # The head (through the image and the state) counts once, on the first read of the image.
    media_tokens = results[0].media_tokens
    assert media_tokens > 0 and all(r.media_tokens == media_tokens for r in results)
    expanded = [len(prompt) + media_tokens for prompt in prompts]
    assert results[0].tokens_computed == expanded[0]
    assert all(r.tokens_computed < n for r, n in zip(results[1:3], expanded[1:], strict=True))
    assert results[3].tokens_computed == expanded[0]


def test_canvas_media_the_model_cannot_read_fail_their_own_read(stub: Any, tokenizer: Any) -> None:
    """A video (DiffusionGemma's encoder takes images only), an image that is no image, and an image that makes the
    prompt too long for the model: each answered for its own read, naming the field; the others go on. A prompt whose
    placeholders do not match its images is a broken contract: the whole RPC is refused."""
    labels = [[token(tokenizer, "yes")], [token(tokenizer, "no")]]
    prompt = media_prompt_ids(tokenizer, 1, f"{STATES[0]}\n\n{QUESTION}")
    canvas = single_canvas(tokenizer, 150)
    video = canvas_read(0, prompt, canvas, [(0, labels)])
    video.media.append(media_item(video_bytes(6, 4, seed=1), "videos.0"))
    broken = canvas_read(1, prompt, canvas, [(0, labels)])
    broken.media.append(media_item(b"not an image", "images.0"))
    good = with_media(canvas_read(2, prompt, canvas, [(0, labels)]), [png(5)])
    # A prompt that fits the model's positions with its placeholder but not once its image expands: the router
    # cannot know the expansion, so the read is answered with a media error (a 400), not refused as malformed.
    short = media_prompt_ids(tokenizer, 1, "9")
    digits = 8192 - len(canvas) - len(short) - 8
    long_prompt = media_prompt_ids(tokenizer, 1, "9" * digits)
    assert len(long_prompt) + len(canvas) <= 8192
    too_long = with_media(canvas_read(3, long_prompt, canvas, [(0, labels)]), [png(5)])
    results = stub.Read(decision_pb2.ReadRequest(reads=[video, broken, good, too_long])).results
    assert results[0].media_error == "videos.0: this model does not take video inputs"
    assert results[1].media_error.startswith("images.0: ")
    assert results[2].media_error == "" and len(results[2].canvas.rows) == 1
    media_tokens = results[2].media_tokens
    assert results[3].media_error == (
        f"images: with its media expanded ({media_tokens} tokens) the prompt has {len(long_prompt) + media_tokens} "
        "tokens, and its canvas adds 16: more than the model's 8192 positions"
    )
    missing = with_media(canvas_read(3, media_prompt_ids(tokenizer, 0, "x"), canvas, [(0, labels)]), [png(5)])
    with pytest.raises(grpc.RpcError) as err:
        stub.Read(decision_pb2.ReadRequest(reads=[missing]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the prompt has 0 image placeholders for 1 images" in (err.value.details() or "")


def test_the_fixture_ships_gemma4s_processor_for_its_vision_tower(diffusion: LoadedModel, diffusion_dir: Path) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(diffusion_dir)
    assert type(processor).__name__ == "Gemma4Processor"
    config = diffusion.module.config  # type: ignore[attr-defined]
    assert config.get_text_config().use_bidirectional_attention == "vision"
    assert processor.tokenizer.convert_tokens_to_ids("<|image|>") == config.image_token_id < diffusion.vocab_size
    assert processor.image_processor.patch_size == config.vision_config.patch_size
    assert processor.image_processor.pooling_kernel_size == config.vision_config.pooling_kernel_size


def test_prompts_that_part_before_their_image_are_encoded_whole(
    stub: Any, reference: Any, diffusion_dir: Path, tokenizer: Any
) -> None:
    """Two canvases about one image whose prompts share a long head that ends before the image (their system
    turns part late): a shared head would cut the image block, so each is encoded whole, equal to the model's own
    forward."""
    labels = [token(tokenizer, text) for text in LABELS]
    image = png(31, 70, 90)
    prompts = []
    for ending in ("first", "second"):
        content = [{"type": "image"}, {"type": "text", "text": f"{STATES[0]}\\n\\n{QUESTION}"}]
        messages = [
            {"role": "system", "content": "You route tickets. " * 8 + ending},
            {"role": "user", "content": content},
        ]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tokenizer.encode(text + THOUGHT, add_special_tokens=False))
    shared = next(i for i, (a, b) in enumerate(zip(*prompts, strict=False)) if a != b)
    image_at = prompts[0].index(tokenizer.convert_tokens_to_ids("<|image|>"))
    assert 32 <= shared < image_at
    canvases = [single_canvas(tokenizer, 160), single_canvas(tokenizer, 161)]
    reads = [
        with_media(canvas_read(i, prompt, canvas, [(0, [[t] for t in labels])]), [image])
        for i, (prompt, canvas) in enumerate(zip(prompts, canvases, strict=True))
    ]
    results = stub.Read(decision_pb2.ReadRequest(reads=reads)).results
    for prompt, canvas, result in zip(prompts, canvases, results, strict=True):
        assert result.media_error == ""
        expected = reference_media_logprobs(reference, diffusion_dir, prompt, [image], canvas)
        (values,) = row_values(result)
        assert values == pytest.approx([float(expected[0, t]) for t in labels], abs=1e-5)
        assert result.tokens_computed == len(prompt) + result.media_tokens
