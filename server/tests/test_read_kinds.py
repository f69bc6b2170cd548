"""The shard's seam: every kind of the proto's `Read` oneof has its codec (`read_kinds/`) and at least one engine in
`ENGINE_TABLE`, and a model's capabilities are resolved once, when its engine is built."""

from __future__ import annotations

from decision_server import architectures
from decision_server.engines import ENGINE_TABLE, make_engine
from decision_server.model_base import LoadedModel, capabilities_of
from decision_server.pb import decision_pb2
from decision_server.read_kinds import READ_KINDS, read_kind_of


def test_every_read_kind_has_a_codec_and_an_engine() -> None:
    kinds = {field.name for field in decision_pb2.Read.DESCRIPTOR.oneofs_by_name["kind"].fields}
    assert set(READ_KINDS) == kinds
    assert {kind for kind, _ in ENGINE_TABLE} == kinds
    assert tuple(mode for kind, mode in ENGINE_TABLE if kind == architectures.NEXT_TOKEN) == architectures.ENGINE_NAMES
    for kind, engine in architectures.KIND_ENGINES.items():
        assert (kind, engine) in ENGINE_TABLE


def test_capabilities_are_resolved_when_the_engine_is_built(tiny_qwen3: LoadedModel) -> None:
    capabilities = capabilities_of(tiny_qwen3)
    # The shard's own decoder: packs segments, reuses cached prefixes, reads no media, has no head or canvas.
    assert capabilities.packs_segments and capabilities.prefix_cache_refusal is None
    assert capabilities.media_scoring is capabilities.media_processor is capabilities.pooled is None
    assert capabilities.block_diffusion is None
    for mode in architectures.ENGINE_NAMES:
        engine = make_engine(mode, tiny_qwen3)
        assert engine.capabilities == capabilities
        assert read_kind_of(engine).name == engine.read_kind == architectures.NEXT_TOKEN
