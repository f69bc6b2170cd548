"""Host-to-device copies that never wait for the device: every input of a pass goes through `to_device`.

On CUDA, torch copies from pageable host memory synchronously and then waits for the stream, so such a copy waits
for all the work queued before it. From pinned memory the copy is queued like a kernel (torch's pinned-memory pool
keeps the block until the copy has run). A batch is planned and launched while the batch before it is still on the
device (`Engine.start`), and the prefix cache's inserts run while a pass is (`LoadedModel.launch`): a waiting copy in
either would hold the host until the device caught up. On CPU this is a plain conversion."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def to_device(
    data: torch.Tensor | np.ndarray | Sequence[int], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """`data` (a host tensor, array or list) as a `dtype` tensor on `device`, queued without waiting on CUDA."""
    if isinstance(data, torch.Tensor):
        host = data.to(dtype)
    elif isinstance(data, np.ndarray):
        host = torch.from_numpy(np.ascontiguousarray(data)).to(dtype)
    else:
        host = torch.tensor(data, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
