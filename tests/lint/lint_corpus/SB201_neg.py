import triton
import triton.language as tl


@triton.jit
def counters(lock_ptr, count_ptr, x_ptr, out_ptr):
    one = 1
    tl.atomic_add(count_ptr, 1)
    tl.atomic_add(count_ptr, one * 4)
    while tl.atomic_cas(lock_ptr, 0, 1) == 1:
        pass
    tl.atomic_xchg(lock_ptr, 0)
    n = tl.load(x_ptr).to(tl.int32)
    tl.atomic_add(count_ptr, n)
    tl.atomic_add(count_ptr, tl.full((16,), 1, dtype=tl.int32))
    tl.atomic_add(count_ptr + tl.arange(0, 16), tl.arange(0, 16))
    tl.atomic_max(out_ptr, tl.load(x_ptr))  # max and min are exact, so their order does not matter
    tl.atomic_min(out_ptr, tl.load(x_ptr))
    # tl.atomic_add(out_ptr, 1.0)
    s = "tl.atomic_add(out_ptr, 1.0)"


@triton.jit
def reserve(offset_ptr, flag_ptr, value, size: tl.uint64):
    record = size + 1
    tl.atomic_add(offset_ptr, record, sem="relaxed")
    tl.atomic_xchg(flag_ptr, tl.full([], 1, tl.uint64), sem="release")
    tl.atomic_xchg(flag_ptr, value)  # an unknown value moved by xchg/cas is a flag more often than a sum
