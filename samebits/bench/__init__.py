"""`samebits bench` and benchmarks/e2e.py: a workload of random prompts through the engine in each mode, timed (tok/s,
TTFT, ITL, time inside the step by kind), checked (requests re-run alone vs inside the load) and held against the
workload's roofline on this device."""
