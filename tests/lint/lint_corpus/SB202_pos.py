import triton
import triton.language as tl

CONFIGS = [triton.Config({"BK": 32}), triton.Config({"BK": 64})]


@triton.autotune(configs=CONFIGS, key=["M", "N", "K"])  # expect: SB202
@triton.jit
def mm(a, b, c, M, N, K, BK: tl.constexpr):
    acc = tl.zeros((16, 16), dtype=tl.float32)
    for k in range(0, K, BK):
        acc += tl.dot(tl.load(a), tl.load(b))
    tl.store(c, acc)


@triton.autotune(CONFIGS, ["num_tokens", "hidden"])  # expect: SB202
@triton.jit
def norm(x, y, num_tokens, hidden, BLOCK: tl.constexpr):
    tl.store(y, tl.sum(tl.load(x), axis=0))


@triton.autotune(configs=CONFIGS, key=["batch_size", "D"])  # expect: SB202
@triton.jit
def loop_sum(x, y, batch_size, D, BLOCK: tl.constexpr):
    acc = 0.0
    for i in range(D):
        acc += tl.load(x + i)
    tl.store(y, acc)
