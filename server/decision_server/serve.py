"""The `serve` command: load the model, bind the gRPC server on a unix socket, run until signalled.
Readiness is logged only after a real forward pass and health probe, never merely when the socket exists."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import stat
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NoReturn

import grpc

from decision_server import collector
from decision_server.architectures import architecture_of, choose_engine
from decision_server.distributed import ParallelConfig
from decision_server.engines import AnyEngine, make_engine
from decision_server.model import LoadedModel, LoadOptions, dtype_name, load_config, load_model
from decision_server.pb import decision_pb2_grpc
from decision_server.read_kinds import read_kind_of
from decision_server.service import DecisionShardService, new_model_thread
from decision_server.telemetry import tracing_for

logger = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
SHUTDOWN_GRACE_S = 5.0


@dataclass(frozen=True)
class ServeConfig:
    """Everything `serve` needs, passed whole from the CLI."""

    model_dir: Path
    uds_path: Path
    dtype: str = "auto"
    read_mode: str = "auto"
    matmul: str = "auto"
    compile_mode: str = "auto"
    cuda_graphs: str = "auto"
    # Where `--matmul auto` keeps its probes' fastest times (`paths.matmul_record()` from the CLI; None: nowhere).
    matmul_record: Path | None = None
    threads: int | None = None
    prefix_cache_mb: int | str = "auto"
    # Packed tokens of one forward pass; None: the device's auto budget (`batch_budget.plan_batch_budget`).
    max_batch_prefill_tokens: int | None = None
    otlp_endpoint: str | None = None
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    # The process's garbage collector settled after warm-up (`collector`); False leaves it alone, for a caller
    # that runs `serve` inside a process of its own (a test).
    settle_heap: bool = True

    def load_options(self, needs_custom_mask: bool) -> LoadOptions:
        """The flags that act on the weights, for `load_model` (the engine decides whether masks are custom)."""
        return LoadOptions(
            dtype=self.dtype,
            threads=self.threads,
            needs_custom_mask=needs_custom_mask,
            parallel=self.parallel,
            matmul=self.matmul,
            compile_mode=self.compile_mode,
            cuda_graphs=self.cuda_graphs,
            max_batch_prefill_tokens=self.max_batch_prefill_tokens,
            matmul_record=self.matmul_record,
        )


def remove_stale_socket(path: Path) -> None:
    """A socket left by a killed shard would make bind fail; anything that is not a socket is left alone, and a
    socket another process still listens on is refused: replacing it would silently hand that server's router this
    shard (two launchers on one machine with the default `--uds-path`)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except OSError:
        pass  # nobody listens: a stale socket
    else:
        raise FileExistsError(
            f"{path} is the socket of a running shard (another server on this machine?); give this one its own "
            "--uds-path (the launcher's UDS_PATH)"
        )
    finally:
        probe.close()
    path.unlink()


def build_server(service: DecisionShardService, uds_path: Path) -> grpc.aio.Server:
    """A grpc.aio server with `service`, bound to unix://uds_path (not started). Call inside the event loop."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ]
    )
    decision_pb2_grpc.add_DecisionShardServicer_to_server(service, server)
    uds_path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(uds_path)
    server.add_insecure_port(f"unix://{uds_path}")
    return server


def warm_up(model: LoadedModel, engine: AnyEngine) -> None:
    """One tiny read of the engine's kind and a probe, so the first real read does not pay for lazy kernel set-up.
    With tensor parallelism every rank runs it at startup, so it also proves the collectives work."""
    read_kind_of(engine).warm_up(model, engine)
    model.probe()
    cache = engine.prefix_cache
    if cache is not None and model.device.type == "cpu":
        seconds = cache.prefault()
        logger.info(
            "prefix cache memory touched",
            extra={"fields": {"bytes": cache.capacity_bytes, "seconds": round(seconds, 3)}},
        )


async def serve(config: ServeConfig) -> int:
    """Serves until signalled; the exit status (1 after an unrecoverable error). The CLI then calls `leave`."""
    # The engine is chosen from the config before any weight is read: a refusal (tree on a hybrid) is immediate,
    # and the attention kernel depends on it (only tree passes take custom masks).
    hf_config = load_config(config.model_dir)
    engine_name = choose_engine(
        config.read_mode, architecture_of(hf_config), hf_config.get_text_config(), config.model_dir
    )
    # Loading, warm-up and every read run on one thread: a second thread entering OpenMP would make the shard's
    # workers sleep between parallel regions (`new_model_thread`).
    model_thread = new_model_thread()
    loop = asyncio.get_running_loop()
    model = await loop.run_in_executor(
        model_thread,
        partial(load_model, config.model_dir, config.load_options(needs_custom_mask=engine_name in ("tree", "canvas"))),
    )
    engine = await loop.run_in_executor(
        model_thread, make_engine, engine_name, model, config.prefix_cache_mb, config.max_batch_prefill_tokens
    )
    await loop.run_in_executor(model_thread, warm_up, model, engine)
    # Loaded and warm: what the heap holds now lives as long as the shard (`collector` says why this pays).
    settled = collector.settle() if config.settle_heap else collector.current()

    stop = asyncio.Event()

    def request_stop(reason: str) -> None:
        logger.info("shutdown requested", extra={"fields": {"reason": reason}})
        stop.set()

    def on_fatal(exc: BaseException) -> None:
        # Called from a handler on the loop; the shard exits non-zero so the launcher reports it.
        logger.critical("unrecoverable error, stopping", extra={"fields": {"error": str(exc)}})
        fatal.append(exc)
        stop.set()

    fatal: list[BaseException] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, request_stop, signal.Signals(signum).name)

    tracing = tracing_for(config.otlp_endpoint, model.rank, model.world_size)
    service = DecisionShardService(model, engine, on_fatal=on_fatal, tracing=tracing, model_thread=model_thread)
    server = build_server(service, config.uds_path)
    await server.start()
    try:
        logger.info(
            "ready",
            extra={
                "fields": {
                    "uds_path": str(config.uds_path),
                    "model": str(config.model_dir),
                    "architecture": model.architecture,
                    "dtype": dtype_name(model.dtype),
                    "device": model.device_name,
                    "engine": engine.name,
                    "implementation": model.implementation,
                    "prefix_cache_bytes": engine.cache_plan.capacity_bytes,
                    "prefix_cache": engine.cache_plan.rule,
                    "batch_token_budget": engine.batch_budget.tokens,
                    "batch_budget": engine.batch_budget.rule,
                    "capabilities": engine.capabilities.summary(),
                    "rank": model.rank,
                    "world_size": model.world_size,
                    "weight_bytes": model.weight_bytes(),
                    "frozen_objects": settled.frozen_objects,
                    "gc_thresholds": list(settled.thresholds),
                    "pid": os.getpid(),
                }
            },
        )
        await stop.wait()
    finally:
        await server.stop(SHUTDOWN_GRACE_S)
        service.close()
        tracing.shutdown()
        try:
            config.uds_path.unlink()
        except FileNotFoundError:
            pass
        logger.info("stopped", extra={"fields": {"uds_path": str(config.uds_path)}})
    if model.world_size == 1:
        # With more ranks the model thread can be blocked inside a collective whose peer is gone, where it can be
        # neither interrupted nor joined: the caller leaves without waiting for it (`leave`).
        model.close()
    return 1 if fatal else 0


def leave(code: int) -> NoReturn:
    """Ends a shard's process once `serve` returned: its socket, logs and traces are done, so it leaves without
    tearing the interpreter down (torch's modules and tensors freed one by one, atexit joins of the model thread).
    That teardown made SIGTERM to exit take 1.4-1.5 s on SmolLM2 on a quiet CPU (0.09 s without it) and 3.6-4.8 s in a
    container under load, and a launcher, a container's scale-down and a rolling update all waited for it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
