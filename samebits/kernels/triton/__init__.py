"""The Triton backend: one module per kernel family, each a `_name_kernel`, its launcher (asserting shapes and dtypes)
and, named in its docstring, the torch reference a test holds it to. `backend` is the deterministic op set on CUDA,
`fast` fast mode's. The bug the probes demonstrate lives in kernels/demos/, never an op.

Imported only on CUDA or under TRITON_INTERPRET=1 (tests), so importing samebits never needs triton.
"""
