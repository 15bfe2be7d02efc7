import triton
import triton.language as tl
from triton.language import atomic_add


@triton.jit
def splitk(a_ptr, c_ptr, n):
    acc = tl.load(a_ptr + tl.arange(0, 16)).to(tl.float32)
    tl.atomic_add(c_ptr + tl.arange(0, 16), acc)  # expect: SB201
    atomic_add(c_ptr, 1.0)  # expect: SB201
    tl.atomic_xchg(c_ptr, acc)  # expect: SB201
    tl.atomic_cas(c_ptr, 0.0, 1.5)  # expect: SB201
    tl.atomic_add(c_ptr, val=acc * 2, mask=n > 0)  # expect: SB201
    tl.atomic_add(c_ptr,  # expect: SB201
                  tl.sum(acc, axis=0))
    tl.atomic_add(c_ptr, tl.load(a_ptr))  # expect: SB201
    tl.atomic_xchg(c_ptr, tl.load(a_ptr).to(tl.float16))  # expect: SB201
