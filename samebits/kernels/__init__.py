"""samebits.kernels."""
