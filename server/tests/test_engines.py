"""The engines on hybrid and multimodal architectures (Qwen3.5, LFM2-VL, Gemma4) and the registry that picks them:
each engine equals independent transformers forwards, and tree never runs where one masked pass would be wrong."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
import torch
from conftest import (
    grouped_read,
    label_logprobs,
    read_request,
    reference_logprobs,
    reference_sequence_logprob,
    running_shard,
    socket_dir,
)
from test_tree_vs_naive import decision_batch, expected_tokens_computed
from tiny_models import TINY_MODELS, VOCAB, build_tiny_model

from decision_server import architectures
from decision_server.architectures import EngineRefusedError, choose_engine
from decision_server.engines import ENGINES, ForkEngine, NaiveEngine, ReadSpec, TreeEngine, make_engine
from decision_server.model import LoadedModel, LoadOptions, load_model
from decision_server.pb import decision_pb2

HYBRID = [name for name, (_, _, hybrid) in TINY_MODELS.items() if hybrid]
ATTENTION_ONLY = [name for name, (_, _, hybrid) in TINY_MODELS.items() if not hybrid]
# (tiny model, engine) for every engine the registry allows on it.
ALLOWED = [(name, engine) for name in TINY_MODELS for engine in ("fork", "naive")] + [
    (name, "tree") for name in ATTENTION_ONLY
]
TOLERANCE = 1e-5


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    root = tmp_path_factory.mktemp("tiny-models")
    return lambda name: build_tiny_model(name, root / name)


_models: dict[str, LoadedModel] = {}
_references: dict[str, Any] = {}


@pytest.fixture(scope="session")
def tiny_model(tiny_dir: Callable[[str], Path]) -> Callable[[str], LoadedModel]:
    """The shard's model, loaded through the registry (`load_model`), once per session."""

    def get(name: str) -> LoadedModel:
        if name not in _models:
            _models[name] = load_model(tiny_dir(name), LoadOptions(dtype="float32"))
        return _models[name]

    return get


@pytest.fixture(scope="session")
def tiny_reference(tiny_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    """The same checkpoint loaded by its transformers class directly: an independent computation."""

    def get(name: str) -> Any:
        if name not in _references:
            import transformers

            architecture = TINY_MODELS[name][0]
            model_class = getattr(transformers, architecture)
            _references[name] = model_class.from_pretrained(tiny_dir(name), dtype=torch.float32).eval()
        return _references[name]

    return get


def random_batch(seed: int = 0) -> list[ReadSpec]:
    """Two "requests" (a shared head, a state each) with three questions each, labels that are single tokens and
    multi-token sequences sharing a first token, an unrelated read and a salted copy that must share nothing."""
    generator = torch.Generator().manual_seed(seed)

    def tokens(count: int) -> tuple[int, ...]:
        return tuple(torch.randint(1, VOCAB - 2, (count,), generator=generator).tolist())

    head, states, questions = tokens(20), [tokens(10), tokens(12)], [tokens(8), tokens(6), tokens(9)]
    labels = ((5,), (6,), (9, 10, 11), (9, 12), (13, 14))
    reads = [
        ReadSpec(id=10 * s + q, prompt=head + state + question, labels=labels)
        for s, state in enumerate(states)
        for q, question in enumerate(questions)
    ]
    reads.append(ReadSpec(id=99, prompt=tokens(7), labels=((3,), (4, 5))))
    reads.append(ReadSpec(id=100, prompt=reads[0].prompt, labels=labels, cache_salt="tenant-b"))
    return reads


def assert_equals_reference(outcomes: Any, reads: list[ReadSpec], reference: Any) -> float:
    """Every label equals the chain of conditionals of plain forwards; returns the largest difference."""
    worst = 0.0
    for outcome, read in zip(outcomes.outcomes, reads, strict=True):
        assert outcome.id == read.id
        for label, value in zip(read.labels, outcome.label_logprobs, strict=True):
            expected = reference_sequence_logprob(reference, list(read.prompt), list(label))
            assert value == pytest.approx(expected, abs=TOLERANCE), (read.id, label)
            worst = max(worst, abs(value - expected))
        assert outcome.greedy_token_id == int(reference_logprobs(reference, list(read.prompt)).argmax())
    return worst


@pytest.mark.parametrize(("name", "engine"), ALLOWED)
def test_engine_equals_plain_forwards_per_question(
    tiny_model: Callable[[str], LoadedModel], tiny_reference: Callable[[str], Any], name: str, engine: str
) -> None:
    model = tiny_model(name)
    reads = random_batch()
    outcomes = ENGINES[engine](model).run(reads)
    worst = assert_equals_reference(outcomes, reads, tiny_reference(name))
    print(f"{name} {engine}: max |engine - plain forward| = {worst:.2e}")
    if engine == "naive":
        multi = [sum(1 for label in read.labels if len(label) > 1) for read in reads]
        assert [o.tokens_computed for o in outcomes.outcomes] == [
            len(r.prompt) * (1 + m) for r, m in zip(reads, multi, strict=True)
        ]
    else:
        # Shared heads are computed, and counted, once per salt.
        assert [o.tokens_computed for o in outcomes.outcomes] == expected_tokens_computed(reads)


@pytest.mark.parametrize("name", HYBRID)
def test_fork_runs_each_shared_token_once(tiny_model: Callable[[str], LoadedModel], name: str) -> None:
    model = tiny_model(name)
    reads = random_batch()
    fed: list[int] = []
    engine = ForkEngine(model)
    original = model.continue_state

    def counting(state: Any, request: Any) -> Any:
        fed.append(len(request.token_ids))
        return original(state, request)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(model, "continue_state", counting)
        outcomes = engine.run(reads)
    prompts = {(read.cache_salt, read.prompt[:end]) for read in reads for end in range(1, len(read.prompt) + 1)}
    branches = {
        (read.cache_salt, read.prompt + label[:end])
        for read in reads
        for label in read.labels
        for end in range(1, len(label))
    }
    # Every unique prompt prefix and label branch token is fed exactly once, in as many passes as there are runs
    # between branch points.
    assert sum(fed) == outcomes.packed_tokens == len(prompts | branches)
    assert outcomes.forward_passes == len(fed) < sum(len(read.prompt) for read in reads)


def test_fork_equals_naive_on_the_shard_decoder(tiny_qwen3: LoadedModel, naive_outcomes: Any) -> None:
    # The decoder keeps keys/values only (KeyValueState): forking shares the head's tensors, never copies them.
    reads = decision_batch(tiny_qwen3.path)
    fork = ForkEngine(tiny_qwen3).run(reads)
    naive = naive_outcomes(tiny_qwen3, reads)
    worst = 0.0
    for a, b in zip(fork.outcomes, naive.outcomes, strict=True):
        assert a.id == b.id and a.greedy_token_id == b.greedy_token_id
        assert a.label_logprobs == pytest.approx(b.label_logprobs, abs=TOLERANCE)
        worst = max([worst, *(abs(x - y) for x, y in zip(a.label_logprobs, b.label_logprobs, strict=True))])
    print(f"tiny_qwen3 fork: max |fork - naive| = {worst:.2e}")
    assert [o.tokens_computed for o in fork.outcomes] == expected_tokens_computed(reads)
    assert fork.forward_passes < naive.forward_passes


@pytest.mark.parametrize("name", HYBRID)
def test_a_tree_pass_would_be_wrong_on_hybrids(
    tiny_model: Callable[[str], LoadedModel], tiny_reference: Callable[[str], Any], name: str
) -> None:
    """The refusal guards a real error: forced past it, one masked pass mixes the questions' recurrences."""
    model = tiny_model(name)
    reads = random_batch()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("decision_server.engines.tree.tree_refusal", lambda config: None)
        forced = TreeEngine(model).run(reads)
    naive = NaiveEngine(model).run(reads)
    worst = max(
        abs(a - b)
        for x, y in zip(forced.outcomes, naive.outcomes, strict=True)
        for a, b in zip(x.label_logprobs, y.label_logprobs, strict=True)
    )
    print(f"{name}: a forced tree pass is off by {worst:.2e}")
    # LFM2's convolutions reach two tokens back, so only the first tokens of a branch mix: less off than Qwen3.5.
    assert worst > 10 * TOLERANCE


# --- the registry ------------------------------------------------------------------------------------------------


def test_registry_table() -> None:
    table = {name: entry.implementation for name, entry in architectures.ARCHITECTURES.items()}
    assert table == {
        "LlamaForCausalLM": "decoder",
        "Qwen3ForCausalLM": "decoder",
        "Qwen3_5ForConditionalGeneration": "transformers",
        "Qwen3_5MoeForConditionalGeneration": "transformers",
        "Gemma4ForCausalLM": "transformers",
        "Gemma4ForConditionalGeneration": "transformers",
        "Lfm2VlForConditionalGeneration": "transformers",
        "DiffusionGemmaForBlockDiffusion": "transformers",
    }
    reads = {name: entry.reads for name, entry in architectures.ARCHITECTURES.items() if entry.reads != "next_token"}
    assert reads == {"DiffusionGemmaForBlockDiffusion": "canvas"}
    import transformers

    from decision_server import decoder

    for entry in architectures.ARCHITECTURES.values():
        if entry.implementation == "decoder":
            assert entry.name in decoder.ARCHITECTURES
        else:
            assert hasattr(transformers, entry.transformers_class), entry.transformers_class
    unknown = architectures.lookup("MistralForCausalLM")
    assert (unknown.implementation, unknown.transformers_class) == ("transformers", "AutoModelForCausalLM")
    assert tuple(ENGINES) == architectures.ENGINE_NAMES


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_tiny_models_load_as_the_registry_says(tiny_model: Callable[[str], LoadedModel], name: str) -> None:
    architecture, _, hybrid = TINY_MODELS[name]
    model = tiny_model(name)
    assert (model.architecture, model.implementation) == (architecture, "transformers")
    assert type(model.module).__name__ == architecture  # type: ignore[attr-defined]
    assert architectures.is_hybrid(model.text_config) == hybrid
    assert make_engine("auto", model).name == ("fork" if hybrid else "tree")


def _config(**fields: Any) -> Any:
    return SimpleNamespace(**fields)


# Configs that ignore masks somewhere, in the fields different families use; names the registry does not know too.
HYBRID_CONFIGS = {
    "qwen3.5 linear attention": ("Qwen3_5ForConditionalGeneration", _config(layer_types=["linear_attention"] * 3)),
    "lfm2 convolutions": ("Lfm2VlForConditionalGeneration", _config(layer_types=["conv", "full_attention"])),
    "qwen3-next (unlisted)": ("Qwen3NextForCausalLM", _config(layer_types=["linear_attention", "full_attention"])),
    "jamba (unlisted)": ("JambaForCausalLM", _config(layers_block_type=["mamba", "attention"])),
    "recurrentgemma (unlisted)": ("RecurrentGemmaForCausalLM", _config(block_types=["recurrent", "attention"])),
    "mamba (unlisted)": ("MambaForCausalLM", _config(model_type="mamba", num_hidden_layers=2)),
    "a listed name with an unknown layer kind": ("Gemma4ForCausalLM", _config(layer_types=["rwkv", "full_attention"])),
}


@pytest.mark.parametrize("case", list(HYBRID_CONFIGS))
def test_registry_never_picks_tree_for_a_hybrid(case: str) -> None:
    architecture, config = HYBRID_CONFIGS[case]
    assert architectures.is_hybrid(config)
    assert choose_engine("auto", architecture, config) == "fork"
    with pytest.raises(EngineRefusedError, match="ignore an attention mask"):
        choose_engine("tree", architecture, config)
    assert choose_engine("fork", architecture, config) == "fork"
    assert choose_engine("naive", architecture, config) == "naive"


def test_attention_only_configs_read_with_tree() -> None:
    for kinds in (["full_attention"] * 2, ["sliding_attention", "full_attention"], None):
        assert choose_engine("auto", "Gemma4ForCausalLM", _config(layer_types=kinds)) == "tree"
    # Attention the tree engine has no mask for is refused too, but not as a hybrid.
    chunked = _config(layer_types=["chunked_attention", "full_attention"])
    assert not architectures.is_hybrid(chunked)
    assert choose_engine("auto", "Llama4ForCausalLM", chunked) == "fork"
    with pytest.raises(EngineRefusedError, match="chunked_attention need masks"):
        choose_engine("tree", "Llama4ForCausalLM", chunked)
    with pytest.raises(ValueError, match="unknown read mode 'beam'"):
        choose_engine("beam", "Gemma4ForCausalLM", chunked)


@pytest.mark.parametrize("name", HYBRID)
def test_tree_is_refused_on_loaded_hybrids(tiny_model: Callable[[str], LoadedModel], name: str) -> None:
    model = tiny_model(name)
    reason = "linear_attention" if name.startswith("qwen3_5") else "conv"
    with pytest.raises(EngineRefusedError, match=f"layers of type {reason}"):
        make_engine("tree", model)
    with pytest.raises(EngineRefusedError, match="ignore an attention mask"):
        TreeEngine(model)
    assert isinstance(make_engine("auto", model), ForkEngine)


def test_serve_refuses_tree_on_a_hybrid_before_loading_weights(
    tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from decision_server import serve

    def no_weights(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights were loaded before the engine was checked")

    monkeypatch.setattr(serve, "load_model", no_weights)
    config = serve.ServeConfig(model_dir=tiny_dir("qwen3_5"), uds_path=tmp_path / "s.sock", read_mode="tree")
    with pytest.raises(
        EngineRefusedError, match=r"--read-mode tree cannot serve Qwen3_5ForConditionalGeneration.*fork"
    ):
        asyncio.run(serve.serve(config))
    assert not (tmp_path / "s.sock").exists()


def test_serve_loads_warms_up_and_reads_on_one_thread(
    tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A second thread entering OpenMP gives it a worker team of its own; with more workers than CPUs libgomp puts
    # idle workers to sleep at once, and reads ran 1.4-1.7x slower (measured): one thread does all model work.
    import contextlib
    import threading
    import time

    import grpc

    from decision_server import serve
    from decision_server.pb import decision_pb2_grpc

    seen: dict[str, set[int]] = {}

    def on_thread(name: str, work: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            seen.setdefault(name, set()).add(threading.get_ident())
            return work(*args, **kwargs)

        return recorded

    def engine_with_recorded_reads(*args: Any, **kwargs: Any) -> Any:
        engine = on_thread("make_engine", make_engine)(*args, **kwargs)
        engine.start = on_thread("read", engine.start)  # the service starts (and on CPU finishes) every batch
        return engine

    monkeypatch.setattr(serve, "load_model", on_thread("load", serve.load_model))
    monkeypatch.setattr(serve, "make_engine", engine_with_recorded_reads)
    monkeypatch.setattr(serve, "warm_up", on_thread("warm_up", serve.warm_up))
    with socket_dir() as folder:
        # The heap of pytest's process is left as it is (the CLI test checks that a served shard settles its own).
        config = serve.ServeConfig(model_dir=tiny_dir("gemma4"), uds_path=folder / "s.sock", settle_heap=False)

        async def serve_two_reads() -> None:
            task = asyncio.create_task(serve.serve(config))
            loop = asyncio.get_running_loop()

            def client() -> None:
                try:
                    deadline = time.monotonic() + 120
                    while not config.uds_path.exists() and time.monotonic() < deadline:
                        time.sleep(0.05)
                    with grpc.insecure_channel(f"unix://{config.uds_path}") as channel:
                        stub = decision_pb2_grpc.DecisionShardStub(channel)
                        stub.Read(read_request([(1, [5, 6, 7], [[8], [9, 10]])]), timeout=60)
                        stub.Read(read_request([(2, [5, 6, 7, 8], [[9]])]), timeout=60)
                finally:
                    loop.call_soon_threadsafe(task.cancel)

            caller = threading.Thread(target=client, daemon=True)
            caller.start()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            caller.join(timeout=60)

        asyncio.run(serve_two_reads())
    assert set(seen) == {"load", "make_engine", "warm_up", "read"}
    threads = set().union(*seen.values())
    assert len(threads) == 1 and threads != {threading.get_ident()}, seen


def test_cli_read_modes_are_the_registry_ones() -> None:
    from decision_server.cli import build_parser

    parser = build_parser()
    (serve,) = [action for action in parser._subparsers._group_actions if action.dest == "command"]  # type: ignore[union-attr]
    read_mode = next(a for a in serve.choices["serve"]._actions if a.dest == "read_mode")  # type: ignore[index]
    assert tuple(read_mode.choices) == architectures.READ_MODES
    assert read_mode.default == "auto"


# --- through the gRPC service --------------------------------------------------------------------------------------


@pytest.fixture
def hybrid_stub(tiny_model: Callable[[str], LoadedModel]) -> Iterator[Any]:
    with running_shard(tiny_model("qwen3_5"), "auto") as stub:
        yield stub


def test_info_reports_engine_and_implementation(hybrid_stub: Any) -> None:
    info = hybrid_stub.Info(decision_pb2.InfoRequest(), timeout=30)
    assert (info.architecture, info.engine, info.implementation) == (
        "Qwen3_5ForConditionalGeneration",
        "fork",
        "transformers",
    )


@pytest.mark.parametrize("name", list(TINY_MODELS))
def test_shard_reads_equal_a_plain_forward(
    tiny_model: Callable[[str], LoadedModel], tiny_reference: Callable[[str], Any], name: str
) -> None:
    reference = tiny_reference(name)
    reads = random_batch(seed=3)[:4]
    request = decision_pb2.ReadRequest(
        reads=[grouped_read(r.id, list(r.prompt), [[list(label)] for label in r.labels]) for r in reads]
    )
    with running_shard(tiny_model(name), "auto") as stub:
        response = stub.Read(request, timeout=60)
    for result, read in zip(response.results, reads, strict=True):
        expected = reference_logprobs(reference, list(read.prompt))
        values = label_logprobs(result)
        for label, value in zip(read.labels, values, strict=True):
            if len(label) == 1:
                assert value == pytest.approx(float(expected[label[0]]), abs=TOLERANCE)
            else:
                reference_value = reference_sequence_logprob(reference, list(read.prompt), list(label))
                assert value == pytest.approx(reference_value, abs=TOLERANCE)
        assert result.next_token.greedy_token_id == int(expected.argmax())


@pytest.mark.parametrize("name", ["tiny_qwen3", "qwen3_5"])
def test_label_groups_return_one_logprob_per_variant_in_order(
    request: pytest.FixtureRequest, tiny_model: Callable[[str], LoadedModel], name: str
) -> None:
    model = request.getfixturevalue(name) if name == "tiny_qwen3" else tiny_model(name)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18]
    groups = [[[40]], [[41], [42, 43], [44]], [[45, 46, 47], [45, 48]]]
    flat = [variant for group in groups for variant in group]
    with running_shard(model, "auto") as stub:
        (grouped,) = stub.Read(decision_pb2.ReadRequest(reads=[grouped_read(3, prompt, groups)]), timeout=60).results
        (single,) = stub.Read(
            decision_pb2.ReadRequest(reads=[grouped_read(4, prompt, [[variant] for variant in flat])]), timeout=60
        ).results
    assert [len(group.variant_logprobs) for group in grouped.next_token.labels] == [1, 3, 2]
    # Each variant scored on its own, in the group's order: the same numbers as one group per sequence.
    assert label_logprobs(grouped) == pytest.approx(label_logprobs(single), abs=1e-6)
    assert len(set(label_logprobs(grouped))) == len(flat)
    assert grouped.next_token.greedy_token_id == single.next_token.greedy_token_id


def test_reads_without_a_kind_or_with_empty_groups_are_invalid_argument(hybrid_stub: Any) -> None:
    cases = [
        (decision_pb2.Read(id=7), "read 7: no read kind set; this shard computes next_token reads"),
        (grouped_read(8, [1, 2, 3], [[[4]], []]), "read 8: label 1 has no variants"),
        (grouped_read(9, [1, 2, 3], [[[4]], [[5], []]]), "read 9: label 1 variant 1 has no tokens"),
        (
            grouped_read(10, [1, 2, 3], [[[4], [5, VOCAB]]]),
            f"read 10: label 0 variant 1 token id {VOCAB} is out of range",
        ),
    ]
    good = grouped_read(1, [1, 2, 3], [[[4]]])
    for read, message in cases:
        with pytest.raises(grpc.RpcError) as failure:
            hybrid_stub.Read(decision_pb2.ReadRequest(reads=[good, read]), timeout=60)
        assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in failure.value.details()
    (result,) = hybrid_stub.Read(decision_pb2.ReadRequest(reads=[good]), timeout=60).results
    assert len(label_logprobs(result)) == 1


def test_qwen3_5_keeps_no_rope_offset_between_reads(
    tiny_model: Callable[[str], LoadedModel], tiny_reference: Callable[[str], Any]
) -> None:
    """Trap 2: a multimodal call leaves `rope_deltas` on the module; a later text read must not add it."""
    model = tiny_model("qwen3_5")
    reads = random_batch(seed=5)[:2]
    for engine in (ForkEngine(model), NaiveEngine(model)):
        model.module.model.rope_deltas = torch.tensor([[7]])  # type: ignore[attr-defined]  # as an image read leaves
        outcomes = engine.run(reads)
        assert_equals_reference(outcomes, reads, tiny_reference("qwen3_5"))
        assert model.module.model.rope_deltas is None  # type: ignore[attr-defined]


# --- the family fixtures of `decision-server make-fixture` (real-style tokenizers and chat templates) ---------------

FAMILY_FIXTURES = {
    "tiny-qwen3.5": "fork",
    "tiny-qwen3.5-moe": "fork",
    "tiny-lfm2-vl": "fork",
    "tiny-gemma4": "tree",
}


@pytest.mark.parametrize("fixture", list(FAMILY_FIXTURES))
def test_family_fixtures_read_like_a_plain_forward(fixture: str) -> None:
    import transformers
    from prompts import QUESTIONS, STATES, label_tokens, prompt_tokens

    from decision_server.fixtures import make_fixture
    from decision_server.paths import fixture_dir

    out = fixture_dir(fixture, 0)
    make_fixture(fixture, out, seed=0)
    model = load_model(out, LoadOptions(dtype="float32"))
    reference = getattr(transformers, model.architecture).from_pretrained(out, dtype=torch.float32).eval()
    labels = [label_tokens(out, text) for text in ("A", "B", " yes", "no")]
    reads = [
        ReadSpec(id=i, prompt=tuple(prompt_tokens(out, state, QUESTIONS[i % 3])), labels=tuple(map(tuple, labels)))
        for i, state in enumerate(STATES)
    ]
    engine = make_engine("auto", model)
    assert engine.name == FAMILY_FIXTURES[fixture]
    worst = assert_equals_reference(engine.run(reads), reads, reference)
    print(f"{fixture} {engine.name}: max |engine - plain forward| = {worst:.2e}")
