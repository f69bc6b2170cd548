"""Atomic, idempotent creation of a model folder (exports and fixtures).
A folder is published by renaming a finished temp sibling, so a reader never sees half a model."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Written last into the temp folder: its presence in a published folder means every other file is complete.
MARKER_NAME = ".decision-complete.json"


def is_complete(folder: Path, required: Iterable[str], revision: int | None = None) -> bool:
    """Every required file is there, and with `revision`, the marker records that revision (a builder bumps it when
    what it writes changes, so a cached folder from an older builder is rebuilt)."""
    marker = folder / MARKER_NAME
    if not marker.is_file() or not all((folder / name).is_file() for name in required):
        return False
    if revision is None:
        return True
    try:
        recorded = json.loads(marker.read_text()).get("revision")
    except (OSError, ValueError, AttributeError):
        return False
    return bool(recorded == revision)


def _make_readable(folder: Path) -> None:
    # Some writers (safetensors) create owner-only files; a cached model is shared with other users and
    # containers that mount the cache, so files follow the umask like any other created file.
    umask = os.umask(0)
    os.umask(umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)
    folder.chmod(0o777 & ~umask)


def build_folder_atomically(
    out: Path,
    required: Iterable[str],
    build: Callable[[Path], dict[str, Any]],
    revision: int | None = None,
) -> bool:
    """Runs `build(tmp)` and publishes tmp as `out`; returns False when `out` was already complete.

    `build` returns metadata recorded in the completion marker (with `revision` added when given). An incomplete
    `out` (from a run that was killed before this scheme existed, edited by hand, or of another revision) is replaced.
    """
    required = list(required)
    if is_complete(out, required, revision):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        metadata = build(tmp)
        if revision is not None:
            metadata = {**metadata, "revision": revision}
        missing = [name for name in required if not (tmp / name).is_file()]
        if missing:
            raise RuntimeError(f"building {out} did not produce {', '.join(missing)}")
        (tmp / MARKER_NAME).write_text(json.dumps(metadata, indent=2, sort_keys=True) + "\n")
        _make_readable(tmp)
        if out.exists():
            if is_complete(out, required, revision):
                # Another process published while we worked; theirs is as good as ours.
                shutil.rmtree(tmp)
                return False
            logger.warning("replacing incomplete folder", extra={"fields": {"path": str(out)}})
            shutil.rmtree(out)
        try:
            os.rename(tmp, out)
        except OSError:
            if is_complete(out, required, revision):
                shutil.rmtree(tmp)
                return False
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return True
