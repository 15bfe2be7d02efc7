"""A minimal GGUF (v2/v3) reader: metadata as plain Python values, tensors as memory-mapped byte rows.

`gguf.GGUFReader` builds a numpy view per array element and takes seconds on a 49k-token vocabulary; this reads the
same header with `struct` in a fraction of that. Dequantization still uses `gguf.quants`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from samebits.arith import cdiv

MAGIC = b"GGUF"
# GGUF value type -> struct format of a scalar (8 = string, 9 = array are handled apart)
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # HF order: rows first (GGUF lists dims innermost first)
    tensor_type: GGMLQuantizationType
    data: np.ndarray  # uint8 [rows, bytes per row], a view of the memory map


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.pos = buf, 0

    def take(self, fmt: str):
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        n = self.take("Q")
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int):
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("I"), self.take("Q")
            return [self.value(item) for _ in range(count)]
        return self.take(_SCALARS[kind])


def read_gguf(path: Path) -> tuple[dict, list[GGUFTensor]]:
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(raw))
    if bytes(raw[:4]) != MAGIC:
        raise ValueError(f"{path} is not a GGUF file (bad magic {bytes(raw[:4])!r})")
    cur.pos = 4
    version, n_tensors, n_kv = cur.take("I"), cur.take("Q"), cur.take("Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
    meta = {cur.string(): cur.value(cur.take("I")) for _ in range(n_kv)}
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    align = int(meta.get("general.alignment", 32))
    start = cdiv(cur.pos, align) * align
    return meta, [_tensor(raw, start, *info) for info in infos]


def _tensor_info(cur: _Cursor) -> tuple[str, tuple[int, ...], int, int]:
    name = cur.string()
    dims = tuple(cur.take("Q") for _ in range(cur.take("I")))
    return name, dims, cur.take("I"), cur.take("Q")


def _tensor(raw: np.ndarray, start: int, name: str, dims: tuple[int, ...], kind: int, offset: int) -> GGUFTensor:
    try:
        qtype = GGMLQuantizationType(kind)
    except ValueError:
        raise ValueError(f"tensor {name} has unknown GGML type id {kind}") from None
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    row_bytes = dims[0] // block * block_bytes
    rows = int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1
    begin = start + offset
    data = raw[begin:begin + rows * row_bytes].reshape(rows, row_bytes)
    return GGUFTensor(name, tuple(reversed(dims)), qtype, data)
