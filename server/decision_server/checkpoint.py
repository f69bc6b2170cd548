"""Reading a rank's slices of a safetensors checkpoint: only the rows or columns a rank owns are read,
never a whole tensor, so a rank's memory holds its share of the weights and nothing more."""

from __future__ import annotations

import json
import math
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

SAFETENSORS_INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """The folder's weights are missing, or a tensor is absent or has an unexpected shape."""


class Checkpoint:
    """The tensors of a model folder (one or several .safetensors files), opened lazily for slicing.

    Use as a context manager; `bytes_read` counts the bytes of every slice read, as stored on disk.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.bytes_read = 0
        self._files = _tensor_files(folder)
        self._stack = ExitStack()
        self._handles: dict[Path, Any] = {}

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._handles.clear()
        self._stack.close()

    def has(self, name: str) -> bool:
        return name in self._files

    def shape(self, name: str) -> list[int]:
        return list(self._slice(name).get_shape())

    def elements(self, suffix: str = "") -> int:
        """How many values the tensors whose names end in `suffix` hold, from the headers."""
        return sum(math.prod(self.shape(name)) for name in self._files if name.endswith(suffix))

    def stored_dtypes(self, suffix: str = "") -> set[str]:
        """The on-disk dtypes ("BF16", "F32", ...) of the tensors whose names end in `suffix`, from the headers."""
        return {self._slice(name).get_dtype() for name in self._files if name.endswith(suffix)}

    def read(
        self,
        name: str,
        dtype: torch.dtype,
        device: torch.device,
        dim: int | None = None,
        start: int = 0,
        end: int | None = None,
    ) -> torch.Tensor:
        """`name` whole (dim None), or rows (dim 0) / columns (dim 1) [start, end) of it, in `dtype` on `device`."""
        tensor_slice = self._slice(name)
        shape = list(tensor_slice.get_shape())
        if dim is None:
            index: tuple[slice, ...] = tuple(slice(None) for _ in shape)
        else:
            if dim >= len(shape):
                raise CheckpointError(f"{name}: shape {shape} has no dimension {dim} to slice")
            stop = shape[dim] if end is None else end
            if not 0 <= start <= stop <= shape[dim]:
                raise CheckpointError(f"{name}: slice [{start}, {stop}) is outside dimension {dim} of {shape}")
            index = tuple(slice(start, stop) if d == dim else slice(None) for d in range(len(shape)))
        # Indexing a safetensors slice reads only the selected bytes from the memory-mapped file.
        tensor: torch.Tensor = tensor_slice[index] if shape else tensor_slice[...]
        self.bytes_read += tensor.numel() * tensor.element_size()
        return tensor.to(device=device, dtype=dtype).contiguous()

    def expect_shape(self, name: str, expected: list[int]) -> None:
        actual = self.shape(name)
        if actual != expected:
            raise CheckpointError(f"{name}: shape {actual} in {self.folder}, the config implies {expected}")

    def _slice(self, name: str) -> Any:
        file = self._files.get(name)
        if file is None:
            raise CheckpointError(f"{self.folder}: no tensor named {name}")
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = self._stack.enter_context(safe_open(str(file), framework="pt", device="cpu"))
        return self._handles[file].get_slice(name)


def _tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the .safetensors file holding it, from the index when there is one."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder}: no .safetensors weights")
    from safetensors import safe_open

    found: dict[str, Path] = {}
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            for name in handle.keys():
                found[name] = file
    return found
