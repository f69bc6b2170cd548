"""Read kinds: each kind of the proto's `Read` oneof owns its codec (the gRPC read into its engine's specs, the
batch back into the response), its media step and its warm-up read; the service looks its engine's kind up here."""

from __future__ import annotations

from concurrent.futures import Executor
from typing import Any, Protocol

from decision_server.engines import AnyEngine
from decision_server.media import MediaError
from decision_server.model_base import LoadedModel
from decision_server.pb import decision_pb2
from decision_server.read_kinds.canvas import CanvasReads
from decision_server.read_kinds.codec import MODALITIES
from decision_server.read_kinds.next_token import NextTokenReads
from decision_server.read_kinds.pooled import PooledReads


class ReadKind(Protocol):
    """One kind of read: the proto's oneof field `name`, and everything between the wire and its engine."""

    name: str
    # The debug line each batch of this kind logs.
    batch_message: str

    def from_pb(self, request: decision_pb2.ReadRequest) -> list[Any]:
        """The engine's input, one spec per read; a read of another kind is INVALID_ARGUMENT naming it."""
        ...

    async def with_media(
        self, specs: list[Any], engine: AnyEngine, threads: Executor
    ) -> tuple[list[Any], dict[int, MediaError]]:
        """The specs with their media expanded on `threads`, and the reads whose media failed, by position."""
        ...

    def to_pb(self, specs: list[Any], batch: Any, media_errors: dict[int, MediaError]) -> decision_pb2.ReadResponse:
        """The engine's batch as the proto's results, in request order."""
        ...

    def log_fields(self, batch: Any) -> dict[str, Any]:
        """Fields of this kind's batch log line beyond the ones every batch has."""
        ...

    def warm_up(self, model: LoadedModel, engine: AnyEngine) -> None:
        """One tiny read, so the first real read does not pay for lazy kernel set-up."""
        ...


# Every read kind of the proto's oneof; a shard computes its engine's kind and refuses the others as
# INVALID_ARGUMENT (a causal LM has no canvas, a block-diffusion model no plain next-token pass).
READ_KINDS: dict[str, ReadKind] = {kind.name: kind for kind in (NextTokenReads(), PooledReads(), CanvasReads())}


def read_kind_of(engine: AnyEngine) -> ReadKind:
    """The read kind `engine` computes."""
    return READ_KINDS[engine.read_kind]


__all__ = ["MODALITIES", "READ_KINDS", "ReadKind", "read_kind_of"]
