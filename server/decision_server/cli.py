"""The `decision-server` command line: serve a model, convert GGUF checkpoints, build test fixtures.
The shard starts from these explicit flags alone; the launcher passes flags, never hidden environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path

from decision_server import choices
from decision_server.logs import setup_logging
from decision_server.paths import keep_compiled_kernels, matmul_record

logger = logging.getLogger("decision_server")

# Spelled out so parsing flags imports no fixture code (imports here stay lazy); tests/test_hybrid_fixtures.py
# checks it equals decision_server.fixtures.FIXTURE_NAMES.
FIXTURE_NAMES = (
    "tiny-qwen3",
    "qwen3-0.6b",
    "tiny-qwen3.5",
    "tiny-qwen3.5-moe",
    "tiny-lfm2-vl",
    "tiny-gemma4",
    "tiny-gemma4-mm",
    "tiny-diffusiongemma",
    "tiny-clef-flash",
    "tiny-clef-omni",
)


def cache_size(text: str) -> int | str:
    """--prefix-cache-mb: "auto" or a whole number of MiB (0: off)."""
    if text == "auto":
        return text
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected auto or a whole number of MiB, got {text!r}")
    return int(text)


def positive_tokens(text: str) -> int:
    """--max-batch-prefill-tokens: a whole number of tokens, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of tokens, at least 1, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="decision-server",
        description="Model shard of decision-inference: prefill-only label reads over gRPC.",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        help="Logging level of the JSON lines on stderr; below info, only the shard's own loggers "
        "(debug: a line per batch of reads).",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="Serve a Hugging Face model folder over gRPC on a unix socket.")
    serve.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="Local Hugging Face model folder.")
    serve.add_argument(
        "--uds-path", type=Path, required=True, help="Unix socket to listen on; a stale socket there is removed."
    )
    serve.add_argument(
        "--dtype",
        choices=choices.DTYPE_CHOICES,
        default="auto",
        help="Compute dtype; auto is float32 on CPU and, on a GPU, the checkpoint's bfloat16 or float16 "
        "(bfloat16 for a float32 checkpoint).",
    )
    serve.add_argument(
        "--read-mode",
        choices=choices.READ_MODES,
        default="auto",
        help="Engine that runs the reads. tree: one masked forward pass over the batch's unique tokens (exact only "
        "when every layer is attention); fork: prefill each shared head once, copy the model's cache/state per "
        "branch (exact for linear attention and convolutions too); naive: one prefill per read (the reference). "
        "auto: tree for all-attention models, fork for hybrids, canvas for block-diffusion models (DiffusionGemma, "
        "which no other mode reads). tree on a hybrid model is refused at startup.",
    )
    serve.add_argument(
        "--matmul",
        choices=choices.MATMUL_CHOICES,
        default="auto",
        help="How float32 linear layers multiply on CPU. exact: torch's F.linear (MKL), the sums transformers' own "
        "forward computes (labels within 1e-5 of it). fast: oneDNN's prepacked GEMM, the kernel vLLM's CPU backend "
        "uses, 1.1-1.75x faster per GEMM on AMD CPUs; labels move by a few 1e-5. split: each activation as a high "
        "and a low bfloat16 part, two bfloat16 GEMMs summed in float32 (MKL), about 2x faster per GEMM where the CPU "
        "has AMX; labels move by about 1e-4. auto: times the modes at load at the model's widest linear and runs "
        "the fastest, leaving a more exact mode only for one at least 5%% faster on this CPU (the log says what it "
        "measured). In bfloat16 or float16, exact runs the dtype's own GEMM (oneDNN, prepacked) and widen holds the "
        "weights widened to float32 and runs float32 GEMMs (same products, float32 sums in another order, outputs "
        "rounded to the dtype; twice the weights' memory): auto times those two and widens only when the float32 "
        "copies fit in half the free memory. widen on a float32 model is refused. Applies to the shard's own "
        "decoder (Llama family, Qwen3).",
    )
    serve.add_argument(
        "--compile",
        choices=choices.COMPILE_MODES,
        default="auto",
        help="auto: run the decoder's layers between attentions as one compiled graph (torch.compile, inductor: "
        "out projection, norms, gated MLP, QKV, rotary; attention eager between calls) on every device, which "
        "cuts the ops per layer from about 205 to 20 (bench/host_overhead.py); in bfloat16 or float16 on CPU the "
        "elementwise chains of eager passes are fused too (1.15-1.2x faster reads on an AMX CPU). They compile at "
        "load (seconds, cached under the cache directory) and need a C++ compiler on CPU, without which the shard "
        "warns and runs eagerly. Labels move by the fused ops' own rounding (float32: about 1e-5 in "
        "log-probability). off: always eager, float32 bit-equal to transformers. Applies to the shard's own "
        "decoder (Llama family, Qwen3) at world size 1.",
    )
    serve.add_argument(
        "--cuda-graphs",
        choices=choices.CUDA_GRAPH_MODES,
        default="auto",
        help="auto: on a CUDA device, the compiled layers (--compile auto) replay as CUDA graphs, one per layer and "
        "token-count bucket (16 to 4,096 tokens; a pass is padded to its bucket, attention stays eager between "
        "replays), captured at load within 60 s and checked against the compiled pass; a longer pass runs the "
        "compiled layers. Info's cuda_graph_buckets lists the captured buckets. Nothing to capture on CPU or "
        "above world size 1. off: the compiled layers without graphs.",
    )
    serve.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's choice).")
    serve.add_argument(
        "--prefix-cache-mb",
        type=cache_size,
        default="auto",
        help="MiB of keys/values kept for recently read prompt prefixes (tree mode; 0 disables). A repeated "
        "chat head + state then costs only the new tokens; reads with different cache salts never share. auto "
        "(default): room for 8 prompts of the model's full length, at most 10%% of the host memory free after "
        "loading (30%% of each GPU's); /info shows the budget and how it was chosen.",
    )
    serve.add_argument(
        "--max-batch-prefill-tokens",
        type=positive_tokens,
        default=None,
        metavar="TOKENS",
        help="Packed tokens one forward pass may hold; Info reports it and the router packs its calls to it unless "
        "it was given its own value (the launcher passes the same one to both). Unset (auto, default): on CUDA, half "
        "of the memory free after loading and the prefix cache's budget, divided by the activation bytes of one "
        "token estimated from the model's config, within 8192-131072; on CPU 8192. /info shows the budget and how "
        "it was chosen.",
    )
    serve.add_argument(
        "--otlp-endpoint",
        default=None,
        help="OTLP/gRPC collector to export read spans to (e.g. http://collector:4317); each read joins the trace "
        "the router sent in its gRPC metadata. Unset (default): no spans are exported and no connection is made.",
    )
    parallel = serve.add_argument_group(
        "tensor parallelism", "Every rank gets the same flags but its own --rank and --uds-path, and every Read."
    )
    parallel.add_argument("--rank", type=int, default=0, help="This shard's rank in the group, 0 .. world size - 1.")
    parallel.add_argument(
        "--world-size",
        type=int,
        default=1,
        help="Number of tensor-parallel ranks serving the model (Llama-family and Qwen3 models only above 1).",
    )
    parallel.add_argument(
        "--master-addr", default="127.0.0.1", help="Address of the group's rendezvous (rank 0 listens there)."
    )
    parallel.add_argument(
        "--master-port", type=int, default=None, help="TCP port of the group's rendezvous; required above 1 rank."
    )
    parallel.add_argument(
        "--collective-timeout-secs",
        type=float,
        default=None,
        help="A read's collective that waits longer for a peer rank fails, and the shard stops (a dead peer is "
        "usually noticed at once; this bounds a stuck one). Default 60.",
    )
    parallel.add_argument(
        "--join-timeout-secs",
        type=float,
        default=None,
        help="How long ranks wait for each other to join the group and load their weights. Default 600.",
    )

    export_default = commands.add_parser(
        "export-default", help="Convert the embedded default model (SmolLM2-135M-Instruct GGUF) to an HF folder."
    )
    export_default.add_argument(
        "--out", type=Path, default=None, help="Output folder (default: $DECISION_CACHE_DIR/models/<name>)."
    )

    download = commands.add_parser(
        "download",
        help="Download what a server loads of a Hugging Face Hub model (configs, tokenizer files, safetensors) into "
        "the Hugging Face cache, with progress lines on stderr; prints the snapshot folder. Reads HF_ENDPOINT, "
        "HF_TOKEN and HF_HUB_CACHE/HF_HOME; refused under HF_HUB_OFFLINE=1.",
    )
    download.add_argument("model_id", metavar="ORG/NAME[@REVISION]", help="The model's id on the Hub.")
    download.add_argument(
        "--revision", default=None, help="Branch, tag or commit (default: the id's @REVISION, else main)."
    )
    download.add_argument(
        "--progress-every", type=float, default=2.0, help="Seconds between progress lines (default 2)."
    )

    export_gguf = commands.add_parser("export-gguf", help="Convert any GGUF checkpoint to an HF folder.")
    export_gguf.add_argument("gguf_path", type=Path, metavar="GGUF_PATH", help="The .gguf file to convert.")
    export_gguf.add_argument("--out", type=Path, required=True, help="Output folder.")

    fixture = commands.add_parser(
        "make-fixture",
        help="Build a random-weight test model (Qwen3, Qwen3.5, LFM2-VL, Gemma4) with its tokenizer and chat template.",
    )
    fixture.add_argument("name", choices=FIXTURE_NAMES, help="Which fixture shape to build.")
    fixture.add_argument("--out", type=Path, required=True, help="Output folder.")
    fixture.add_argument("--seed", type=int, default=0, help="Seed of the random weights.")

    table = commands.add_parser(
        "print-media-table",
        help="Print the Markdown table of every served architecture and the media it reads (docs/media.md, README).",
    )
    table.add_argument("--compact", action="store_true", help="Statuses only, without notes (the README's table).")
    return parser


# Where Linux says which logical CPUs share a physical core (SMT siblings, "hyperthreads").
SYSFS_CPUS = Path("/sys/devices/system/cpu")


def cpu_siblings(cpu: int, sysfs: Path = SYSFS_CPUS) -> set[int]:
    """The logical CPUs sharing `cpu`'s core, itself included (just itself where the system does not say)."""
    try:
        text = (sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip()
    except OSError:
        return {cpu}
    siblings: set[int] = set()
    for part in filter(None, text.split(",")):
        first, _, last = part.partition("-")
        siblings.update(range(int(first), int(last or first) + 1))
    return siblings or {cpu}


def openmp_should_sleep(cpus: set[int], threads: int | None, world_size: int, sysfs: Path = SYSFS_CPUS) -> bool:
    """Whether the shard's idle OpenMP workers must sleep at once (`OMP_WAIT_POLICY=PASSIVE`) rather than spin
    briefly first (libgomp's default: about 300,000 spins, then sleep).

    A forward runs hundreds of parallel regions with serial work between them. A worker spinning there takes CPU
    only where another thread needs the same core: the core's other hyperthread (SMT), or more threads than CPUs.
    Qwen3-0.6B-shaped, 8 questions over 512 tokens, float32:
    - 2 vCPUs that are one core's two hyperthreads: sleeping was 1.19x and 1.26x the questions/s of spinning;
    - 2 vCPUs on 2 cores: sleeping cost 1.15-1.5x the forward time (bench/results/2026-12-02-per-token/).
    """
    if any(len(cpu_siblings(cpu, sysfs) & cpus) > 1 for cpu in cpus):
        return True
    # Ranks on one CPU split its cores (model.load_model); only an explicit --threads can oversubscribe them.
    return threads is not None and threads * world_size > len(cpus)


def set_openmp_wait_policy(environ: MutableMapping[str, str], threads: int | None, world_size: int) -> None:
    """`OMP_WAIT_POLICY=PASSIVE` where `openmp_should_sleep`, unless the caller chose a policy. Must run before
    torch loads OpenMP, which reads the variable once."""
    if "OMP_WAIT_POLICY" in environ:
        return
    if openmp_should_sleep(set(os.sched_getaffinity(0)), threads, world_size):
        environ["OMP_WAIT_POLICY"] = "PASSIVE"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    setup_logging(args.log_level.upper())
    # Nothing the shard does may reach a model hub; every model is a local folder or a packaged file. `download` is
    # the one command that does, when the operator asked for a Hub model (and it obeys their HF_HUB_OFFLINE).
    if args.command != "download":
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    set_openmp_wait_policy(os.environ, getattr(args, "threads", None), getattr(args, "world_size", 1))
    keep_compiled_kernels()
    try:
        return _dispatch(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        logger.error(f"{args.command} failed: {exc}", exc_info=exc)
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "serve":
        # Checked before importing torch (seconds), so a wrong path fails at once with a clear message.
        if not (args.model_dir / "config.json").is_file():
            raise FileNotFoundError(f"{args.model_dir} is not a Hugging Face model folder (no config.json)")
        from decision_server.distributed import ParallelConfig
        from decision_server.serve import ServeConfig, leave, serve

        config = ServeConfig(
            model_dir=args.model_dir,
            uds_path=args.uds_path,
            dtype=args.dtype,
            read_mode=args.read_mode,
            matmul=args.matmul,
            compile_mode=args.compile,
            cuda_graphs=args.cuda_graphs,
            matmul_record=matmul_record(),
            threads=args.threads,
            prefix_cache_mb=args.prefix_cache_mb,
            max_batch_prefill_tokens=args.max_batch_prefill_tokens,
            otlp_endpoint=args.otlp_endpoint,
            parallel=ParallelConfig(
                rank=args.rank,
                world_size=args.world_size,
                master_addr=args.master_addr,
                master_port=args.master_port,
                # Unset timeouts keep ParallelConfig's defaults, the one place they are written.
                **_given(collective_timeout_s=args.collective_timeout_secs, startup_timeout_s=args.join_timeout_secs),
            ),
        )
        leave(asyncio.run(serve(config)))
    if args.command == "export-default":
        from decision_server.export import export_default

        print(export_default(args.out))
        return 0
    if args.command == "download":
        from decision_server.hub import HubError, download

        try:
            print(download(args.model_id, args.revision, progress_every=args.progress_every))
        except HubError as e:
            print(f"decision-server download: {e}", file=sys.stderr)
            return 3
        return 0
    if args.command == "export-gguf":
        from decision_server.export import export_gguf

        export_gguf(args.gguf_path, args.out)
        print(args.out)
        return 0
    if args.command == "make-fixture":
        from decision_server.fixtures import make_fixture

        make_fixture(args.name, args.out, seed=args.seed)
        print(args.out)
        return 0
    if args.command == "print-media-table":
        from decision_server.media_table import media_table

        print(media_table(notes=not args.compact), end="")
        return 0
    raise AssertionError(f"unhandled command {args.command}")


def _given(**values: float | None) -> dict[str, float]:
    return {name: value for name, value in values.items() if value is not None}


if __name__ == "__main__":
    sys.exit(main())
