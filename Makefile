# Set-up from nothing: a .venv with the pinned CPU torch first (an unpinned torch pulls a multi-GB CUDA build), then
# every other package at the version requirements.lock names (uv's lock, `make lock`), then samebits itself.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.samebits-installed
LOCK := requirements.lock
TORCH := torch==2.13.0
PIP := pip==26.3
# Where the CPU build of torch lies, for the lock's resolution (its metadata, without CUDA's packages): this
# machine's wheel folder; elsewhere PyTorch's CPU index, https://download.pytorch.org/whl/cpu/torch/.
TORCH_WHEELS ?= /opt/wheels
# No folder of this checkout goes on sys.path: python never prepends the working directory or a script's folder
# (a folder there can shadow an installed package; tests/test_import_paths.py).
export PYTHONSAFEPATH := 1
TEST := -m pytest -q -m "not gpu" --timeout=900 tests

.PHONY: demo test test-latest test-gpu lock serve probe lint clean

$(STAMP): pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q $(PIP)
	$(VPY) -m pip install -q $(TORCH) -c $(LOCK)
	$(VPY) -m pip install -q -r $(LOCK)
	$(VPY) -m pip install -q --no-deps --no-build-isolation -e .
	$(VPY) -m pip check
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/samebits demo

test: $(STAMP)
	$(VPY) $(TEST)

# The lock again after a change to pyproject.toml (pins kept where they still fit); UPGRADE=1: every package at its
# newest release. Run `make test` after it and commit both.
lock: $(STAMP)
	$(VENV)/bin/uv pip compile pyproject.toml --extra server --extra triton --extra fleet --extra dev --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --find-links $(TORCH_WHEELS) --no-emit-package torch \
	  --constraint <(echo $(TORCH)) $(if $(UPGRADE),--upgrade) --custom-compile-command "make lock" --quiet -o $(LOCK)

# The suite on the newest release of every dependency (torch stays pinned): drift seen before it lands in the lock.
# Run it before `make lock UPGRADE=1`, and whenever CI's locked run passes but users report breakage.
test-latest:
	rm -rf .venv-latest && $(PY) -m venv .venv-latest
	.venv-latest/bin/python -m pip install -q --upgrade pip
	.venv-latest/bin/python -m pip install -q $(TORCH)
	.venv-latest/bin/python -m pip install -q --upgrade -e '.[server,triton,fleet,dev]'
	.venv-latest/bin/python -m pip freeze --exclude-editable > .venv-latest/versions.txt
	diff <(grep -v '^ *#' $(LOCK) | tr A-Z_ a-z-) <(grep -v '^torch==' .venv-latest/versions.txt | tr A-Z_ a-z-) || true
	.venv-latest/bin/python $(TEST)

# On the GPU machine: the image's python, samebits from this checkout (scripts/device_env.sh), no other install.
test-gpu:
	. scripts/device_env.sh && eval "$$(python3 -m samebits env --shell)" && python3 -m pytest -q -m gpu tests $(PYTEST_ARGS)

serve: $(STAMP)
	$(VENV)/bin/samebits serve

probe: $(STAMP)
	$(VENV)/bin/samebits probe

lint: $(STAMP)
	$(VENV)/bin/samebits lint samebits
	$(VENV)/bin/ruff check samebits tests

clean:
	rm -rf $(VENV) .venv-latest build *.egg-info
