# Sourced by the device machine's scripts and `make test-gpu`: the image's python with samebits from this checkout as
# an editable install, whose finder maps the name `samebits` alone, so no folder of the checkout goes on sys.path
# (tests/test_import_paths.py); wheels the image lacks, if carried in .whl/, into /tmp/site.
export PYTHONUNBUFFERED=1 PYTHONSAFEPATH=1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . >/dev/null || return 1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
