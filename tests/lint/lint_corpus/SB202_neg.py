import triton
import triton.language as tl

CONFIGS = [triton.Config({"BK": 32}), triton.Config({"BK": 64})]


@triton.autotune(configs=CONFIGS, key=["N", "K"])
@triton.jit
def mm(a, b, c, M, N, K, BK: tl.constexpr):
    acc = tl.zeros((16, 16), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
    tl.store(c, acc)


@triton.autotune(configs=CONFIGS, key=["M"])
@triton.jit
def scale(x, y, M, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y + offs, tl.load(x + offs) * 2)
