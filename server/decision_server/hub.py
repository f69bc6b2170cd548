"""Models from the Hugging Face Hub: `decision-server download ORG/NAME` puts the files a server loads (config,
tokenizer and processor files, safetensors weights) into the Hugging Face cache, with progress lines for the launcher.

The launcher runs it when `--model-id ORG/NAME[@REVISION]` is not in the cache. huggingface_hub (transformers' own
dependency) does the transfer and reads its usual environment: HF_ENDPOINT, HF_TOKEN, HF_HUB_CACHE / HF_HOME,
HF_HUB_OFFLINE. A connection cut mid-file is resumed with a range request; files already in the cache are never
fetched again (a file cut by stopping the process starts over: huggingface_hub 2.4 keeps no partial file across
processes), and config.json comes last, so a snapshot holding it is complete (that is how the launcher finds one).
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

# Top-level files a shard or the router reads: configs (model, generation, tokenizer, processor, joint head), chat
# templates, tokenizer vocabularies (tokenizer.json, vocab/merges, SentencePiece, tiktoken ranks) and weights.
NEEDED_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken", ".safetensors")
# Weights only when a repository has no safetensors (transformers loads pytorch_model*.bin); never `*.pth`,
# `*.gguf`, `*.onnx` or anything in a subfolder (`original/`, `onnx/`), which are other formats of the same weights.
FALLBACK_WEIGHTS = ".bin"
PROGRESS_EVERY_S = 2.0


class HubError(Exception):
    """A download that cannot happen, the repository named in the message."""


def needed_files(names: Iterable[str]) -> list[str]:
    """The files of a repository a server loads, config.json last."""
    top = [name for name in names if "/" not in name]
    keep = [name for name in top if name.endswith(NEEDED_SUFFIXES)]
    if any(name.endswith(".safetensors") for name in keep):
        keep = [name for name in keep if not name.startswith("pytorch_model.bin.index")]
    else:
        keep += [name for name in top if name.endswith(FALLBACK_WEIGHTS)]
    return sorted(keep, key=lambda name: (name == "config.json", name))


def split_model_id(model_id: str, revision: str | None) -> tuple[str, str]:
    """`org/name@rev` → (org/name, rev); `--revision` may say the same, not something else; default main."""
    repo, _, at = model_id.partition("@")
    if at and revision and at != revision:
        raise HubError(f"{model_id}: the id names revision {at!r} but --revision says {revision!r}")
    return repo, at or revision or "main"


def size_text(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def duration_text(seconds: float) -> str:
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


@dataclass
class Progress:
    """Bytes arriving in a cache folder's blobs/ (huggingface_hub writes every file there, partial ones too)."""

    blobs: Path
    to_fetch: int
    where: str
    write: Callable[[str], None]
    started: float = 0.0
    base: int = 0

    def _on_disk(self) -> int:
        total = 0
        try:
            for entry in os.scandir(self.blobs):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:  # a partial file renamed or removed while we look
                    pass
        except FileNotFoundError:
            pass
        return total

    def start(self) -> None:
        self.started, self.base = time.monotonic(), self._on_disk()

    def line(self) -> str:
        got = min(max(0, self._on_disk() - self.base), self.to_fetch)
        elapsed = time.monotonic() - self.started
        rate = got / elapsed if elapsed > 0 else 0.0
        share = 100 * got / self.to_fetch if self.to_fetch else 100.0
        eta = duration_text((self.to_fetch - got) / rate) if rate > 0 else "?"
        return (
            f"downloading {self.where}: {size_text(got)} of {size_text(self.to_fetch)} ({share:.0f} %), "
            f"{size_text(rate)}/s, ETA {eta}"
        )

    def report_until(self, done: threading.Event, every: float) -> None:
        while not done.wait(every):
            self.write(self.line())


def download(
    model_id: str,
    revision: str | None = None,
    *,
    token: str | None = None,
    progress_every: float = PROGRESS_EVERY_S,
    out: TextIO | None = None,
) -> Path:
    """Downloads what a server needs of `model_id` (`org/name[@revision]`) into the HF cache; the snapshot folder."""
    stream = out or sys.stderr

    def write(text: str) -> None:
        stream.write(text + "\n")
        stream.flush()

    repo, rev = split_model_id(model_id, revision)
    where = f"{repo}@{rev}"
    # No telemetry unless the operator turns it on: without this huggingface_hub also fetches an "agent harness"
    # registry from the endpoint and adds the torch version to its user agent.
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # One progress line every few seconds, not a log line per HTTP request.
    for name in ("httpx", "httpx2", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Imported here: huggingface_hub reads HF_ENDPOINT, HF_HUB_OFFLINE and the cache location at import.
    import httpx2
    from huggingface_hub import HfApi, constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils.tqdm import disable_progress_bars

    endpoint = constants.ENDPOINT
    if constants.HF_HUB_OFFLINE:
        raise HubError(f"{where} is not in the Hugging Face cache, and HF_HUB_OFFLINE=1 forbids downloading it")
    disable_progress_bars()  # one progress line every few seconds instead of bars the launcher would cut up
    api = HfApi(token=token)
    try:
        info = api.model_info(repo, revision=rev, files_metadata=True)
        siblings = {s.rfilename: s.size or 0 for s in info.siblings or []}
        files = needed_files(siblings)
        if "config.json" not in files:
            raise HubError(f"{where} on {endpoint} has no config.json: it is not a Hugging Face model folder")
        commit = info.sha or rev
        storage = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo, repo_type="model")
        have = {name for name in files if (storage / "snapshots" / commit / name).is_file()}
        total = sum(siblings[name] for name in files)
        to_fetch = sum(siblings[name] for name in files if name not in have)
        skipped = sorted(set(siblings) - set(files))
        write(
            f"downloading {where} (commit {commit[:12]}) from {endpoint}: {len(files) - len(have)} of {len(files)} "
            f"files, {size_text(to_fetch)} of {size_text(total)}"
            + (f"; not fetched (not loaded by a server): {', '.join(skipped)}" if skipped else "")
        )
        progress = Progress(storage / "blobs", to_fetch, where, write)
        progress.start()
        done = threading.Event()
        reporter = threading.Thread(target=progress.report_until, args=(done, progress_every), daemon=True)
        reporter.start()
        try:
            # config.json last: a cut download never leaves a snapshot the launcher would take as complete.
            for batch in ([name for name in files if name != "config.json"], ["config.json"]):
                path = snapshot_download(
                    repo, revision=commit, allow_patterns=[glob.escape(name) for name in batch], token=token
                )
        finally:
            done.set()
            reporter.join()
        write(progress.line())
    except GatedRepoError as e:
        raise HubError(
            f"{repo} is a gated model on {endpoint}: accept its terms on the model's page, then set HF_TOKEN to a "
            f"token of that account (HTTP {e.response.status_code})"
        ) from e
    except RepositoryNotFoundError as e:
        status = e.response.status_code
        hint = "HF_TOKEN was refused" if token or os.environ.get("HF_TOKEN") else "set HF_TOKEN if it is private"
        raise HubError(f"{repo}: no such model on {endpoint}, or no access to it ({hint}; HTTP {status})") from e
    except RevisionNotFoundError as e:
        raise HubError(f"{repo} has no revision {rev!r} on {endpoint} (HTTP {e.response.status_code})") from e
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        if status in (401, 403):
            raise HubError(f"{where}: {endpoint} refused access (HTTP {status}); check HF_TOKEN") from e
        raise HubError(f"{where}: {endpoint} answered HTTP {status}: {str(e).strip().splitlines()[0]}") from e
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx2.TransportError) as e:
        raise HubError(f"{where}: cannot reach {endpoint}: {str(e).strip().splitlines()[0]}") from e
    except OSError as e:
        raise HubError(f"{where}: downloading from {endpoint} failed: {e}") from e
    # `revision=commit` stored no ref for a branch or tag name; the launcher finds the snapshot through it.
    if rev != commit:
        ref = storage / "refs" / rev
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    write(f"downloaded {where} into {path}")
    return Path(path)
