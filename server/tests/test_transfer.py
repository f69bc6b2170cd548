"""`transfer.to_device`, the one way a pass's inputs reach the device: every host form it is given (a list, an array,
a strided array, a tensor of another dtype) arrives as the dtype asked for, with the same values. Its CUDA branch
(pinned memory, a queued copy) runs in the GPU check, whose `host_batch.py` counts the waits for the device."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decision_server.transfer import to_device


@pytest.mark.parametrize(
    "data",
    [[3, 1, 2], np.array([3, 1, 2], dtype=np.int64), np.array([[3, 1, 2]])[:, ::-1][:, ::-1], torch.tensor([3, 1, 2])],
    ids=["list", "array", "strided-array", "tensor"],
)
@pytest.mark.parametrize("dtype", [torch.long, torch.int32])
def test_every_host_form_arrives_as_the_dtype_asked_for(data: object, dtype: torch.dtype) -> None:
    moved = to_device(data, torch.device("cpu"), dtype)  # type: ignore[arg-type]
    assert moved.dtype == dtype and moved.device.type == "cpu"
    assert moved.reshape(-1).tolist() == [3, 1, 2]


def test_booleans_stay_booleans() -> None:
    moved = to_device(np.tri(4, dtype=bool), torch.device("cpu"), torch.bool)
    assert moved.dtype == torch.bool and torch.equal(moved, torch.ones(4, 4, dtype=torch.bool).tril())
