# Set-up from nothing: a .venv, the pinned CPU torch first (an unpinned torch pulls a multi-GB CUDA build), then samebits.
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.samebits-installed

.PHONY: demo test test-gpu serve probe lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -c "import torch" 2>/dev/null || $(VPY) -m pip install -q torch==2.13.0
	$(VPY) -m pip install -q -e '.[server,triton,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/samebits demo

test: $(STAMP)
	$(VPY) -m pytest -q -m "not gpu" --timeout=900 tests

# On the GPU machine: the image's python, no install (scripts/gpu_proof.sh runs this plus the benchmarks).
test-gpu:
	export PYTHONPATH=.$${PYTHONPATH:+:$$PYTHONPATH} && eval "$$(python3 -m samebits env --shell)" && \
	  python3 -m pytest -q -m gpu tests $(PYTEST_ARGS)

serve: $(STAMP)
	$(VENV)/bin/samebits serve

probe: $(STAMP)
	$(VENV)/bin/samebits probe

lint: $(STAMP)
	$(VENV)/bin/samebits lint samebits
	$(VENV)/bin/ruff check samebits tests

clean:
	rm -rf $(VENV) build *.egg-info
