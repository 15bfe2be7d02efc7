"""Two Triton kernels for the compiled check: a float atomic add (a finding) and an integer counter (none)."""
import triton
import triton.language as tl


@triton.jit
def float_atomic_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    # samebits: intentionally nondeterministic because the compiled check must see a float atomic
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs), axis=0))


@triton.jit
def int_counter_kernel(count_ptr, x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs) * 2)
    tl.atomic_add(count_ptr, 1)
