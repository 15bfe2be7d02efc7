"""Demonstrations of the bugs samebits exists to avoid, kept apart from the op backends: `samebits probe` runs them
to show the bits move (probe/probes.py), nothing in the engine may call them, and the PTX audit leaves them out.
Triton kernels, so they live under kernels/ (the one package that imports triton) and import it only when loaded."""
