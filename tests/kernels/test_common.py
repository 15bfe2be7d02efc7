"""kernels/common.py's to_device: integer lists through an array's buffer give exactly torch.tensor's tensor."""
import random

import pytest
import torch

from samebits.kernels.common import to_device

SEED = 20261201


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_lists_and_rows_equal_torch_tensor(dtype):
    rng = random.Random(SEED)
    hi = 2**62 if dtype == torch.int64 else 2**30
    for _ in range(50):
        rows, width = rng.randrange(1, 40), rng.randrange(1, 50)
        nested = [[rng.randrange(-hi, hi) for _ in range(width)] for _ in range(rows)]
        flat = nested[0]
        for values in (nested, flat, [bool(v % 2) for v in flat]):
            got, want = to_device(values, dtype, "cpu"), torch.tensor(values, dtype=dtype)
            assert got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        if rows > 1:  # negative control: the rows' order is what the comparison sees
            swapped = [nested[1], nested[0]] + nested[2:]
            assert not torch.equal(to_device(swapped, dtype, "cpu"), torch.tensor(nested, dtype=dtype)) \
                or nested[0] == nested[1]


def test_other_shapes_and_values_take_torch_tensors_path():
    assert to_device([], torch.int64, "cpu").shape == (0,)
    assert to_device([1.5, 2], torch.int64, "cpu").tolist() == torch.tensor([1.5, 2], dtype=torch.int64).tolist()
    assert to_device((4, 5), torch.int64, "cpu").tolist() == [4, 5]
    with pytest.raises(ValueError, match="expected sequence of length 2"):  # ragged rows: torch's own error
        to_device([[1, 2], [3]], torch.int64, "cpu")
    assert to_device([0.25, 1.0], torch.float32, "cpu").tolist() == [0.25, 1.0]
