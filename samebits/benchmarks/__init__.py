"""The measurements behind docs/BENCHMARKS.md, each run as `python -m samebits.benchmarks.NAME` (most on the H200 through
scripts/gpu_proof.sh), each printing its table and leaving its JSON and PNG under --out through results.py. They live
in the package, as vLLM keeps its own, so that running one puts no folder of the checkout on sys.path: a folder there
once shadowed an installed package (tests/test_import_paths.py)."""
