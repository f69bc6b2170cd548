"""Clef (joint-schema) reads on the shard: the head against a plain float64 implementation of spec/PROMPTS.md §6
written here, whole pooled reads against transformers' own last_hidden_state followed by that reference, images,
batching, and the startup refusal of a head whose config does not match its weights."""

from __future__ import annotations

import io
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch
from conftest import running_shard
from safetensors.torch import load_file

from decision_server.architectures import EngineRefusedError, choose_engine
from decision_server.engines import PooledSpec, make_engine
from decision_server.engines.pooled import PooledEngine, padded_groups
from decision_server.fixtures import make_fixture
from decision_server.joint_head import HEAD_CONFIG, HEAD_WEIGHTS, HeadConfigError, PooledQuestion
from decision_server.model import LoadedModel, LoadOptions, load_model
from decision_server.paths import fixture_dir
from decision_server.pb import decision_pb2

FIXTURES = ("tiny-clef-flash", "tiny-clef-omni")
IMAGE = "<|vision_start|><|image_pad|><|vision_end|>\n"


# --- the reference: §6 step by step, one option at a time, float64, from the raw tensors --------------------------


def layer_norm(x: torch.Tensor, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + 1e-5) * w[f"{name}.weight"] + w[f"{name}.bias"]


def attention(
    queries: torch.Tensor, keys: torch.Tensor, w: dict[str, torch.Tensor], name: str, heads: int
) -> torch.Tensor:
    """Multi-head attention of `queries` [n, d] over `keys` (= values) [m, d], from packed in-projections."""
    width = queries.shape[-1]
    wq, wk, wv = w[f"{name}.in_proj_weight"].split(width)
    bq, bk, bv = w[f"{name}.in_proj_bias"].split(width)
    q, k, v = queries @ wq.T + bq, keys @ wk.T + bk, keys @ wv.T + bv
    size = width // heads
    outputs = []
    for h in range(heads):
        part = slice(h * size, (h + 1) * size)
        scores = q[:, part] @ k[:, part].T / math.sqrt(size)
        outputs.append(torch.softmax(scores, dim=-1) @ v[:, part])
    return torch.cat(outputs, dim=-1) @ w[f"{name}.out_proj.weight"].T + w[f"{name}.out_proj.bias"]


def linear(x: torch.Tensor, w: dict[str, torch.Tensor], name: str, bias: bool = True) -> torch.Tensor:
    out = x @ w[f"{name}.weight"].T
    return out + w[f"{name}.bias"] if bias else out


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a @ b) / (a.norm() * b.norm())


def reference_head(
    w: dict[str, torch.Tensor],
    config: dict[str, int],
    hidden: torch.Tensor,
    token_ids: list[int],
    lm_head: torch.Tensor,
    questions: list[PooledQuestion],
) -> list[list[float]]:
    w = {k: v.double() for k, v in w.items()}
    heads = config["heads"]
    h = layer_norm(hidden.double(), w, "hidden_norm")
    memory = linear(h, w, "memory_projection", bias=False)
    g = h[-1]
    q_vectors = [h[s:e].mean(dim=0) for s, e in (q.span for q in questions)]
    logits: list[list[float]] = []
    routed: list[list[torch.Tensor]] = []
    lexicals: list[list[torch.Tensor]] = []
    for j, question in enumerate(questions):
        xs, lexs = [], []
        for s, e in question.options:
            lex = lm_head.double()[token_ids[s:e]].mean(dim=0)
            x = (
                linear(h[s:e].mean(dim=0), w, "option_context_projection", bias=False)
                + linear(lex, w, "option_lexical_projection", bias=False)
                + linear(q_vectors[j], w, "option_question_projection", bias=False)
            )
            xs.append(x)
            lexs.append(lex)
        routed.append(xs)
        lexicals.append(lexs)
    # Evidence routing over every option of the request at once (they attend to the memory only).
    flat = torch.stack([x for xs in routed for x in xs])
    for layer in range(config["routing_layers"]):
        p = f"evidence_layers.{layer}"
        flat = flat + attention(
            layer_norm(flat, w, f"{p}.query_norm"),
            layer_norm(memory, w, f"{p}.memory_norm"),
            w,
            f"{p}.attention",
            heads,
        )
        inner = gelu(linear(layer_norm(flat, w, f"{p}.feedforward_norm"), w, f"{p}.feedforward.0"))
        flat = flat + linear(inner, w, f"{p}.feedforward.3")
    counts = [len(q.options) for q in questions]
    options = list(torch.split(flat, counts))
    fields = []
    for j, question in enumerate(questions):
        f = linear(q_vectors[j], w, "question_projection", bias=False)
        weights = torch.softmax(torch.stack([x @ f for x in options[j]]) / math.sqrt(f.shape[0]), dim=0)
        summary = sum(a * x for a, x in zip(weights, options[j], strict=True))
        assert isinstance(summary, torch.Tensor)
        fields.append(
            f
            + layer_norm(summary, w, "option_summary_norm")
            + linear(g, w, "global_projection", bias=False)
            + w["type_embedding.weight"][question.type_id]
        )
    x = torch.stack(fields)
    for layer in range(config["layers"]):
        p = f"layers.{layer}"
        n1 = layer_norm(x, w, f"{p}.norm1")
        x = x + attention(n1, n1, w, f"{p}.self_attn", heads)
        x = x + attention(layer_norm(x, w, f"{p}.norm2"), memory, w, f"{p}.multihead_attn", heads)
        x = x + linear(gelu(linear(layer_norm(x, w, f"{p}.norm3"), w, f"{p}.linear1")), w, f"{p}.linear2")
    big_f = layer_norm(x, w, "field_norm")
    cap = math.log(100.0)
    prior_scale = math.exp(min(float(w["prior_logit_scale"]), cap))
    joint_scale = math.exp(min(float(w["joint_logit_scale"]), cap))
    gate = 1.0 / (1.0 + math.exp(-float(w["residual_gate"])))
    for j in range(len(questions)):
        row = []
        for x_o, lex in zip(options[j], lexicals[j], strict=True):
            x_hat = layer_norm(x_o, w, "option_norm")
            fj = big_f[j]
            prior = prior_scale * cosine(lex, q_vectors[j] + g)
            features = torch.cat([fj, x_hat, fj * x_hat, (fj - x_hat).abs()])
            mlp = linear(gelu(linear(features, w, "residual_scorer.0")), w, "residual_scorer.3")[0]
            row.append(float(prior + gate * (joint_scale * cosine(fj, x_hat) + mlp)))
        logits.append(row)
    return logits


# --- fixtures ---------------------------------------------------------------------------------------------------


def _folder(name: str) -> Path:
    out = fixture_dir(name, 0)
    make_fixture(name, out, seed=0)
    return out


@pytest.fixture(scope="module", params=FIXTURES)
def clef(request: pytest.FixtureRequest) -> Iterator[tuple[str, LoadedModel]]:
    model = load_model(_folder(request.param), LoadOptions(dtype="float32"))
    yield request.param, model


def head_weights(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
    import json

    return load_file(str(folder / HEAD_WEIGHTS)), json.loads((folder / HEAD_CONFIG).read_text())


def transformers_hidden(folder: Path, ids: list[int], tensors: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """transformers' own last_hidden_state, loaded here independently of the shard's loader."""
    import transformers

    omni = "omni" in folder.name
    cls = transformers.Qwen3OmniMoeForConditionalGeneration if omni else transformers.Qwen3_5ForConditionalGeneration
    kwargs: dict[str, Any] = {"dtype": torch.float32}
    if omni:
        kwargs["enable_audio_output"] = False
    module = cls.from_pretrained(folder, **kwargs).eval()
    backbone = module.thinker.model if omni else module.model
    with torch.inference_mode():
        out = backbone(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long), **(tensors or {})
        )
    lm_head = (module.thinker if omni else module).lm_head.weight.detach()
    return out.last_hidden_state[0], lm_head


def sample_read(tokenizer: Any) -> tuple[list[int], list[tuple[int, tuple[int, int], tuple[tuple[int, int], ...]]]]:
    """A prompt with three questions (spans from its end, as the router sends them)."""
    pieces = ["STATE:\nThe card was charged twice.", "\nQ1 ", "Which team?", " A ", '{"option_id":"billing"}']
    pieces += [" B ", '{"option_id":"tech"}', "\nQ2 ", "urgent", " yes ", "true", " no ", "false"]
    pieces += ["\nQ3 ", "How upset?", " ", "calm", " ", "annoyed", " ", "furious", "\nEND"]
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for piece in pieces:
        start = len(ids)
        ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
        spans.append((start, len(ids)))
    n = len(ids)

    def rel(i: int) -> tuple[int, int]:
        return spans[i][0] - n, spans[i][1] - n

    questions = [
        (1, rel(2), (rel(4), rel(6))),
        (0, rel(8), (rel(10), rel(12))),
        (2, rel(14), (rel(16), rel(18), rel(20))),
    ]
    return ids, questions


def absolute(n: int, questions: list[Any]) -> list[PooledQuestion]:
    return [
        PooledQuestion(t, (n + s[0], n + s[1]), tuple((n + a, n + b) for a, b in options))
        for t, s, options in questions
    ]


# --- tests ------------------------------------------------------------------------------------------------------


def test_the_head_equals_the_reference_on_random_weights(clef: tuple[str, LoadedModel]) -> None:
    name, model = clef
    folder = _folder(name)
    weights, config = head_weights(folder)
    head = model.head  # type: ignore[attr-defined]
    lm_head = model.output_embedding()  # type: ignore[attr-defined]
    generator = torch.Generator().manual_seed(7)
    length = 40
    hidden = torch.randn(length, config["hidden_size"], generator=generator, dtype=torch.float64)
    token_ids = torch.randint(0, 1000, (length,), generator=generator).tolist()
    questions = [
        PooledQuestion(0, (2, 5), ((5, 7), (7, 9))),
        PooledQuestion(1, (10, 12), ((12, 15), (15, 16), (16, 20), (20, 22))),
        PooledQuestion(2, (23, 24), ((24, 30), (30, 39))),
    ]
    expected = reference_head(weights, config, hidden, token_ids, lm_head, questions)
    import copy

    head64 = copy.deepcopy(head).double()
    got64 = head64(hidden, torch.tensor(token_ids), lm_head.double(), questions)
    got32 = head(hidden.float(), torch.tensor(token_ids), lm_head, questions)
    worst64 = max(
        abs(a - b) for row, exp in zip(got64, expected, strict=True) for a, b in zip(row.tolist(), exp, strict=True)
    )
    worst32 = max(
        abs(a - b) for row, exp in zip(got32, expected, strict=True) for a, b in zip(row.tolist(), exp, strict=True)
    )
    assert worst64 < 1e-6, worst64
    assert worst32 < 1e-4, worst32
    # The random weights exercise every term: logits are far from constant.
    assert max(max(r) - min(r) for r in expected) > 0.05


def test_a_pooled_read_equals_transformers_then_the_reference(clef: tuple[str, LoadedModel]) -> None:
    name, model = clef
    folder = _folder(name)
    tokenizer = model.processor.tokenizer  # type: ignore[attr-defined]
    ids, questions = sample_read(tokenizer)
    engine = make_engine("auto", model)
    assert engine.name == "pooled"
    outcome = engine.run([PooledSpec(id=3, prompt=tuple(ids), questions=tuple(questions))]).outcomes[0]
    hidden, lm_head = transformers_hidden(folder, ids)
    weights, config = head_weights(folder)
    expected = reference_head(weights, config, hidden, ids, lm_head, absolute(len(ids), questions))
    worst = max(
        abs(a - b) for row, exp in zip(outcome.logits, expected, strict=True) for a, b in zip(row, exp, strict=True)
    )
    assert worst < 1e-5, worst
    assert [len(r) for r in outcome.logits] == [2, 2, 3]
    assert outcome.tokens_computed == len(ids)


def test_padded_pooled_reads_equal_their_solo_reads(clef: tuple[str, LoadedModel]) -> None:
    """Text reads of one batch share a right-padded forward; each equals its own read alone within 1e-6 (float32),
    and the padded hidden states equal transformers' solo forward of that prompt."""
    name, model = clef
    folder = _folder(name)
    tokenizer = model.processor.tokenizer  # type: ignore[attr-defined]
    ids, questions = sample_read(tokenizer)
    lead = tokenizer("A much longer state: the parcel came late, opened and half empty. " * 3, add_special_tokens=False)
    prompts = [ids, lead["input_ids"] + ids, tokenizer("Short.", add_special_tokens=False)["input_ids"] + ids]
    specs = [PooledSpec(id=n, prompt=tuple(p), questions=tuple(questions)) for n, p in enumerate(prompts)]
    engine = make_engine("auto", model)
    solo = [engine.run([spec]).outcomes[0] for spec in specs]
    together = engine.run(specs)
    assert together.forward_passes == 1
    assert [o.id for o in together.outcomes] == [0, 1, 2]
    for alone, shared in zip(solo, together.outcomes, strict=True):
        assert shared.tokens_computed == alone.tokens_computed
        worst = max(
            abs(a - b) for r, s in zip(alone.logits, shared.logits, strict=True) for a, b in zip(r, s, strict=True)
        )
        assert worst <= 1e-6, (alone.id, worst)
    padded = model.padded_hidden_states(prompts)  # type: ignore[attr-defined]
    for prompt, hidden in zip(prompts, padded, strict=True):
        expected, _ = transformers_hidden(folder, prompt)
        assert hidden.shape == expected.shape
        assert float((hidden - expected).abs().max()) < 1e-5
    # A tight budget splits the batch (longest first) and changes nothing.
    split = PooledEngine(model, padded_tokens=2 * len(prompts[1])).run(specs)  # type: ignore[arg-type]
    assert split.forward_passes == 2
    for alone, shared in zip(solo, split.outcomes, strict=True):
        for r, s in zip(alone.logits, shared.logits, strict=True):
            assert s == pytest.approx(r, abs=1e-6)


def test_padded_groups_take_the_longest_first_within_the_budget() -> None:
    assert padded_groups([10, 30, 20, 5], budget=60) == [[1, 2], [0, 3]]
    assert padded_groups([10, 30, 20, 5], budget=100) == [[1, 2, 0], [3]]
    assert padded_groups([100, 3], budget=50) == [[0], [1]]
    assert padded_groups([], budget=50) == []


def _png(seed: int, size: tuple[int, int]) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_an_image_read_equals_transformers_with_the_processor(clef: tuple[str, LoadedModel]) -> None:
    import hashlib

    from PIL import Image

    from decision_server.media import MediaItem

    name, model = clef
    folder = _folder(name)
    processor = model.processor  # type: ignore[attr-defined]
    tokenizer = processor.tokenizer
    head_ids = tokenizer("<|im_start|>user\nSTATE:\n", add_special_tokens=False)["input_ids"]
    media_ids = tokenizer(IMAGE, add_special_tokens=False)["input_ids"]
    ids, questions = sample_read(tokenizer)
    prompt = head_ids + media_ids + ids
    data = _png(1, (80, 48))
    item = MediaItem("image", data, hashlib.sha256(data).hexdigest(), "images.0")
    media = model.prepare_pooled_media(9, prompt, (len(head_ids), len(head_ids) + len(media_ids)), (item,))  # type: ignore[attr-defined]
    assert media.media_tokens > 0
    outcome = (
        make_engine("auto", model)
        .run([PooledSpec(id=9, prompt=tuple(prompt), questions=tuple(questions), media=(item,), media_prompt=media)])
        .outcomes[0]
    )
    # The reference: the processor on the placeholder text alone, spliced in as the reference servers do.
    image = Image.open(io.BytesIO(data)).convert("RGB")
    kwargs: dict[str, Any] = {}
    if "omni" in name:
        kwargs["images_kwargs"] = {"size": {"shortest_edge": 65_536, "longest_edge": 1_048_576}}
    else:
        kwargs["return_mm_token_type_ids"] = True
    encoded = processor(text=[IMAGE], images=[image], return_tensors="pt", **kwargs)
    expanded = head_ids + encoded["input_ids"][0].tolist() + ids
    assert list(media.input_ids) == expanded
    tensors = {k: v for k, v in encoded.items() if k not in ("input_ids", "attention_mask")}
    if "mm_token_type_ids" in tensors:
        types = torch.zeros(1, len(expanded), dtype=torch.long)
        types[0, len(head_ids) : len(head_ids) + encoded["input_ids"].shape[1]] = tensors["mm_token_type_ids"][0]
        tensors["mm_token_type_ids"] = types
    hidden, lm_head = transformers_hidden(folder, expanded, tensors)
    weights, config = head_weights(folder)
    expected = reference_head(weights, config, hidden, expanded, lm_head, absolute(len(expanded), questions))
    worst = max(
        abs(a - b) for row, exp in zip(outcome.logits, expected, strict=True) for a, b in zip(row, exp, strict=True)
    )
    assert worst < 1e-5, worst
    assert outcome.media_tokens == media.media_tokens
    # The image changes the answer: media are read, not ignored.
    text_only = make_engine("auto", model).run([PooledSpec(id=1, prompt=tuple(ids), questions=tuple(questions))])
    assert text_only.outcomes[0].logits != outcome.logits


def pooled_read(read_id: int, ids: list[int], questions: list[Any]) -> decision_pb2.Read:
    return decision_pb2.Read(
        id=read_id,
        pooled=decision_pb2.PooledRead(
            token_ids=ids,
            questions=[
                decision_pb2.PooledQuestion(
                    type_id=t,
                    instructions=decision_pb2.PooledSpan(start=s[0], end=s[1]),
                    options=[decision_pb2.PooledSpan(start=a, end=b) for a, b in options],
                )
                for t, s, options in questions
            ],
        ),
    )


def test_the_shard_batches_pooled_reads_and_refuses_other_kinds(clef: tuple[str, LoadedModel]) -> None:
    name, model = clef
    tokenizer = model.processor.tokenizer  # type: ignore[attr-defined]
    ids, questions = sample_read(tokenizer)
    other = tokenizer("Another state entirely", add_special_tokens=False)["input_ids"] + ids
    with running_shard(model, make_engine("auto", model)) as stub:
        info = stub.Info(decision_pb2.InfoRequest())
        assert (info.engine, info.implementation, info.read_kind) == ("pooled", "transformers", "pooled")
        assert decision_pb2.IMAGE in list(info.modalities)
        alone = [
            stub.Read(decision_pb2.ReadRequest(reads=[pooled_read(i, p, questions)])) for i, p in ((0, ids), (1, other))
        ]
        both = stub.Read(
            decision_pb2.ReadRequest(reads=[pooled_read(0, ids, questions), pooled_read(1, other, questions)])
        )
        assert both.head_micros > 0 and both.forward_micros > both.head_micros
        for single, batched in zip(alone, both.results, strict=True):
            a = [list(q.option_logits) for q in single.results[0].pooled.questions]
            b = [list(q.option_logits) for q in batched.pooled.questions]
            assert [len(r) for r in a] == [len(r) for r in b]
            for r, s in zip(a, b, strict=True):
                assert s == pytest.approx(r, abs=1e-6)
            assert batched.tokens_computed == single.results[0].tokens_computed
        next_token = decision_pb2.Read(id=5, next_token=decision_pb2.NextTokenRead(token_ids=ids))
        with pytest.raises(grpc.RpcError) as err:
            stub.Read(decision_pb2.ReadRequest(reads=[next_token]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "read kind next_token is not computed by this shard (it computes pooled reads)" in (
            err.value.details() or ""
        )
        bad = [(1, (-3, -3), ((-2, -1),))]
        with pytest.raises(grpc.RpcError) as err:
            stub.Read(decision_pb2.ReadRequest(reads=[pooled_read(6, ids, bad)]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "question 0 instructions: span [-3, -3)" in (err.value.details() or "")
    for mode in ("tree", "fork", "naive"):
        with pytest.raises(EngineRefusedError, match="joint-schema head"):
            choose_engine(mode, model.architecture, model.text_config, _folder(name))


def _copy_with_head(folder: Path, tmp: Path, config: dict[str, int]) -> Path:
    """The fixture with another head config: every other file linked, not copied (the backbone is 160 MB)."""
    import json

    out = tmp / folder.name
    out.mkdir()
    for path in folder.iterdir():
        if path.name != HEAD_CONFIG:
            (out / path.name).symlink_to(path)
    (out / HEAD_CONFIG).write_text(json.dumps(config))
    return out


def test_a_head_config_that_does_not_match_its_weights_is_refused_naming_the_tensor(tmp_path: Path) -> None:
    folder = _folder("tiny-clef-flash")
    _, config = head_weights(folder)
    wider = _copy_with_head(folder, tmp_path, {**config, "feedforward": config["feedforward"] * 2})
    with pytest.raises(
        HeadConfigError, match=r"tensor 'evidence_layers\.0\.feedforward\.0\.weight' has shape \[128, 64\]"
    ):
        load_model(wider, LoadOptions(dtype="float32"))
    (tmp_path / "deeper").mkdir()
    deeper = _copy_with_head(folder, tmp_path / "deeper", {**config, "layers": config["layers"] + 1})
    with pytest.raises(HeadConfigError, match=r"tensor 'layers\.2\.self_attn\.in_proj_weight' is missing"):
        load_model(deeper, LoadOptions(dtype="float32"))
    (tmp_path / "shallow").mkdir()
    shallow = _copy_with_head(folder, tmp_path / "shallow", {**config, "routing_layers": 0})
    with pytest.raises(HeadConfigError, match=r"tensor 'evidence_layers\.0\.\S+' is not part of the head"):
        load_model(shallow, LoadOptions(dtype="float32"))
    shutil.rmtree(tmp_path / "shallow")


def test_clef_fixtures_ship_what_vllm_needs() -> None:
    import json

    for name in FIXTURES:
        folder = _folder(name)
        assert (folder / "model.safetensors.index.json").is_file()
        config = json.loads((folder / "config.json").read_text())
        if "omni" in name:
            vision = config["thinker_config"]["vision_config"]
            assert vision["apply_vit_abs_pos_embed"] is True and vision["image_size"] == 768
        # transformers always interleaves these models' M-RoPE sections; vLLM only when the config says
        # `mrope_interleaved` (without it, image reads were 4.6e-3 off vLLM's: bench/results/2026-12-02-clef).
        text = (config.get("thinker_config") or config)["text_config"]
        assert text["rope_parameters"]["mrope_interleaved"] is True
        weights, head_config = head_weights(folder)
        assert head_config["hidden_size"] == 128
        # Random, not default-initialised, scalars and norm gains.
        assert float(weights["residual_gate"]) != 0.0
        assert not torch.equal(weights["hidden_norm.weight"], torch.ones_like(weights["hidden_norm.weight"]))


VIDEO = "<|vision_start|><|video_pad|><|vision_end|>\n"
AUDIO = "<|audio_start|><|audio_pad|><|audio_end|>\n"


def _item(kind: str, data: bytes, index: int = 0) -> Any:
    import hashlib

    from decision_server.media import MediaItem

    field = {"image": "images", "video": "videos", "audio": "audio"}[kind]
    return MediaItem(kind, data, hashlib.sha256(data).hexdigest(), f"{field}.{index}")


@pytest.mark.parametrize(
    ("name", "kinds"),
    [
        ("tiny-clef-flash", ("video",)),
        ("tiny-clef-omni", ("video",)),
        ("tiny-clef-omni", ("audio",)),
        ("tiny-clef-omni", ("soundtrack",)),
    ],
)
def test_video_and_audio_reads_equal_transformers_on_the_processed_prompt(name: str, kinds: tuple[str, ...]) -> None:
    """Flash reads videos (2 fps, soundtracks ignored); Omni reads audio, and a video's soundtrack with it when every
    video has one. The whole read equals transformers' backbone on the processor's output plus the reference head."""
    from decision_server.fixtures.media_samples import audio_bytes, video_bytes

    folder = _folder(name)
    model = load_model(folder, LoadOptions(dtype="float32"))
    tokenizer = model.processor.tokenizer  # type: ignore[attr-defined]
    placeholders, items = "", []
    for kind in kinds:
        if kind == "audio":
            placeholders += AUDIO
            items.append(_item("audio", audio_bytes(1.0)))
        else:
            placeholders += VIDEO
            items.append(_item("video", video_bytes(8, 4, soundtrack_hertz=440.0 if kind == "soundtrack" else None)))
    head_ids = tokenizer("STATE:\n", add_special_tokens=False)["input_ids"]
    media_ids = tokenizer(placeholders, add_special_tokens=False)["input_ids"]
    ids, questions = sample_read(tokenizer)
    prompt = head_ids + media_ids + ids
    media = model.prepare_pooled_media(2, prompt, (len(head_ids), len(head_ids) + len(media_ids)), items)  # type: ignore[attr-defined]
    assert media.media_tokens > 0
    assert ("use_audio_in_video" in media.tensors) == (kinds == ("soundtrack",))
    outcome = (
        make_engine("auto", model)
        .run(
            [PooledSpec(id=2, prompt=tuple(prompt), questions=tuple(questions), media=tuple(items), media_prompt=media)]
        )
        .outcomes[0]
    )
    tensors = {k: v for k, v in media.tensors.items() if k != "use_audio_in_video"}
    if "use_audio_in_video" in media.tensors:
        tensors["use_audio_in_video"] = True  # type: ignore[assignment]
    hidden, lm_head = transformers_hidden(folder, list(media.input_ids), tensors)
    weights, config = head_weights(folder)
    expected = reference_head(
        weights, config, hidden, list(media.input_ids), lm_head, absolute(len(media.input_ids), questions)
    )
    worst = max(
        abs(a - b) for row, exp in zip(outcome.logits, expected, strict=True) for a, b in zip(row, exp, strict=True)
    )
    assert worst < 1e-5, worst


def test_audio_with_soundtrack_videos_is_refused_and_flash_takes_no_audio() -> None:
    from decision_server.fixtures.media_samples import audio_bytes, video_bytes
    from decision_server.media import MediaError

    omni = load_model(_folder("tiny-clef-omni"), LoadOptions(dtype="float32"))
    tokenizer = omni.processor.tokenizer  # type: ignore[attr-defined]
    stretch = tokenizer(AUDIO + VIDEO, add_special_tokens=False)["input_ids"]
    prompt = [*stretch, *tokenizer("state", add_special_tokens=False)["input_ids"]]
    items = [_item("audio", audio_bytes(1.0)), _item("video", video_bytes(8, 4, soundtrack_hertz=440.0))]
    with pytest.raises(MediaError, match=r"^audio\.0: audio clips cannot be read with videos that have soundtracks"):
        omni.prepare_pooled_media(1, prompt, (0, len(stretch)), items)  # type: ignore[attr-defined]
    # A video without a soundtrack leaves the clip its own slot.
    silent = [items[0], _item("video", video_bytes(8, 4))]
    assert omni.prepare_pooled_media(1, prompt, (0, len(stretch)), silent).media_tokens > 0  # type: ignore[attr-defined]
    flash = load_model(_folder("tiny-clef-flash"), LoadOptions(dtype="float32"))
    assert flash.modalities == ("image", "video")
    with pytest.raises(MediaError, match=r"audio\.0: this model does not take audio inputs"):
        flash.prepare_pooled_media(1, prompt, (0, len(stretch)), items[:1])  # type: ignore[attr-defined]


def _omni_with_two_kv_heads(tmp: Path) -> Path:
    """tiny-clef-omni's config with two key/value heads (one per rank; the fixture's one does not split), fresh
    random backbone weights, the fixture's tokenizer, processor and head."""
    import json

    import transformers

    source = _folder("tiny-clef-omni")
    config = json.loads((source / "config.json").read_text())
    config["thinker_config"]["text_config"]["num_key_value_heads"] = 2
    torch.manual_seed(0)
    module = transformers.Qwen3OmniMoeForConditionalGeneration(transformers.Qwen3OmniMoeConfig.from_dict(config))
    out = tmp / "tiny-clef-omni-kv2"
    module.to(torch.float32).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "processor_config.json"):
        shutil.copy(source / name, out / name)
    for name in (HEAD_CONFIG, HEAD_WEIGHTS):
        shutil.copy(source / name, out / name)
    return out


@pytest.mark.parametrize("name", FIXTURES)
def test_two_ranks_read_what_one_shard_reads(name: str, tmp_path: Path) -> None:
    """Tensor parallelism for the backbone: two `decision-server serve` ranks (gloo on CPU; transformers' plan splits
    the text model's heads, MLPs and experts) answer pooled reads, alone, batched and with an image, as one shard
    does, within float rounding of the all-reduces; every rank answers the same; each holds less than the whole."""
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from test_tensor_parallel import _logged, sharded

    folder = _folder(name) if "flash" in name else _omni_with_two_kv_heads(tmp_path)
    model = load_model(folder, LoadOptions(dtype="float32"))
    tokenizer = model.processor.tokenizer  # type: ignore[attr-defined]
    ids, questions = sample_read(tokenizer)
    other = tokenizer("Another state entirely", add_special_tokens=False)["input_ids"] + ids
    head_ids = tokenizer("<|im_start|>user\nSTATE:\n", add_special_tokens=False)["input_ids"]
    media_ids = tokenizer(IMAGE, add_special_tokens=False)["input_ids"]
    data = _png(1, (80, 48))
    with_image = pooled_read(2, head_ids + media_ids + ids, questions)
    with_image.pooled.media_start, with_image.pooled.media_end = len(head_ids), len(head_ids) + len(media_ids)
    with_image.media.append(
        decision_pb2.MediaItem(
            modality=decision_pb2.IMAGE, data=data, sha256=hashlib.sha256(data).hexdigest(), name="images.0"
        )
    )
    requests = [
        decision_pb2.ReadRequest(reads=[pooled_read(0, ids, questions)]),
        decision_pb2.ReadRequest(reads=[pooled_read(0, ids, questions), pooled_read(1, other, questions), with_image]),
    ]
    with running_shard(model, make_engine("auto", model)) as stub:
        expected = [stub.Read(r, timeout=120) for r in requests]

    def logits(response: decision_pb2.ReadResponse) -> list[list[list[float]]]:
        return [[list(q.option_logits) for q in r.pooled.questions] for r in response.results]

    with sharded(folder, read_mode="auto") as ranks:
        infos = [rank.stub.Info(decision_pb2.InfoRequest(), timeout=30) for rank in ranks]
        assert [(i.world_size, i.rank, i.engine) for i in infos] == [(2, 0, "pooled"), (2, 1, "pooled")]
        worst = 0.0
        for request, alone in zip(requests, expected, strict=True):
            with ThreadPoolExecutor(max_workers=2) as pool:
                answers = [f.result() for f in [pool.submit(rank.stub.Read, request, timeout=120) for rank in ranks]]
            assert logits(answers[1]) == logits(answers[0])
            assert [r.media_tokens for r in answers[0].results] == [r.media_tokens for r in alone.results]
            for a, b in zip(logits(alone), logits(answers[0]), strict=True):
                for row_a, row_b in zip(a, b, strict=True):
                    assert len(row_a) == len(row_b)
                    worst = max([worst, *(abs(x - y) for x, y in zip(row_a, row_b, strict=True))])
        print(f"{name}: max |1 shard - 2 shards| pooled logit = {worst:.3g}")
        assert worst < 1e-5
        assert expected[1].results[2].media_tokens > 0
        loaded = [_logged(rank, "model loaded") for rank in ranks]
        assert [r["world_size"] for r in loaded] == [2, 2]
        assert all(r["weight_bytes"] < model.weight_bytes() for r in loaded)


def test_tensor_parallel_refuses_a_text_model_whose_heads_do_not_split() -> None:
    import transformers

    from decision_server.joint_schema import _tensor_parallel_refusal

    omni = transformers.AutoConfig.from_pretrained(_folder("tiny-clef-omni")).thinker_config.get_text_config()
    assert _tensor_parallel_refusal(omni, 2) == "its 1 key/value heads do not split evenly over 2 ranks"
    flash = transformers.AutoConfig.from_pretrained(_folder("tiny-clef-flash")).get_text_config()
    assert _tensor_parallel_refusal(flash, 2) is None
    assert _tensor_parallel_refusal(flash, 3) == "its 4 attention heads do not split evenly over 3 ranks"
    # At startup, before joining any group (nothing listens on port 9).
    from decision_server.decoder import UnsupportedModelError
    from decision_server.distributed import ParallelConfig

    with pytest.raises(UnsupportedModelError, match=r"cannot serve Clef-Omni with --world-size 2: its 1 key/value"):
        parallel = ParallelConfig(world_size=2, master_port=9)
        load_model(_folder("tiny-clef-omni"), LoadOptions(dtype="float32", parallel=parallel))
