"""The weights digest: which bits a model holds, computed where they live, in one pass, the same on every device.

Per tensor the bits are read as 16-bit words (bytes where an element is one byte). Each chunk of CHUNK_WORDS words
gives one exact integer: sum of word x position weight, the weights in [1, 2**15] and the words within +-2**15, so a
product fits int32 and a chunk's sum fits int64 with room to spare. Nothing overflows and integer addition is
associative, so the sum is the same whatever the reduction order, device or thread count. blake2b then hashes, in name
order, each tensor's name, shape, dtype and chunk sums. Changing any one word changes its chunk's sum (its weight is
not zero). A checksum names weights; it is not a defence against crafted collisions.

On the device: an 8B model's 16 GB in bf16 never cross to the host, only its chunk sums do (one int64 per 32 MB).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch

CHUNK_WORDS = 1 << 24  # max |chunk sum| <= 2**24 * 2**15 * 2**15 = 2**54 < 2**63
_WEIGHT_BITS = 15


def position_weights(n: int, device) -> torch.Tensor:
    """Weights of word positions 0..n-1 in a chunk: Knuth's multiplicative hash of the position, 15 bits, plus one."""
    j = torch.arange(n, dtype=torch.int64)
    mixed = (j * 2654435761) & 0xFFFFFFFF  # j < 2**24, so the product < 2**56: exact in int64
    return ((mixed >> (32 - _WEIGHT_BITS)) + 1).to(torch.int32).to(device)


def words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as one flat run of int16 words (uint8 for one-byte elements)."""
    flat = tensor.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8) if flat.element_size() == 1 else flat.view(torch.int16)


def chunk_sums(word_run: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """One exact int64 sum per chunk, left on the tensor's device."""
    sums = [(part * weights[:part.numel()]).sum(dtype=torch.int64)  # int16 x int32 -> int32, exact
            for part in word_run.split(CHUNK_WORDS)]
    return torch.stack(sums) if sums else torch.zeros(0, dtype=torch.int64, device=word_run.device)


def weights_digest(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> str:
    """16 hex digits naming the tensors' names, shapes, dtypes and bits; the same on CPU and CUDA for the same bits."""
    tensors = sorted(named_tensors, key=lambda item: item[0])
    longest = min(max((words(t).numel() for _, t in tensors), default=0), CHUNK_WORDS)
    weights_on: dict[torch.device, torch.Tensor] = {}
    sums = []
    with torch.no_grad():
        for _, tensor in tensors:
            run = words(tensor)
            if run.device not in weights_on:
                weights_on[run.device] = position_weights(longest, run.device)
            sums.append(chunk_sums(run, weights_on[run.device]))
    values = torch.cat([s.to(sums[0].device) for s in sums]).tolist() if sums else []  # one read back
    return _hash(tensors, [s.numel() for s in sums], values)


def _hash(tensors: list, counts: list[int], values: list[int]) -> str:
    h = hashlib.blake2b(digest_size=8)
    at = 0
    for (name, tensor), n in zip(tensors, counts):
        h.update(f"{name}|{tuple(tensor.shape)}|{str(tensor.dtype).removeprefix('torch.')}|".encode())
        for value in values[at:at + n]:
            h.update(value.to_bytes(8, "little", signed=True))
        at += n
    return h.hexdigest()
