"""The CPU backend: `backend` is the deterministic op set, `gemm` the proven MKL route, `reduce` the written-down sum
order, `attention` the tiled paged attention built on both."""
