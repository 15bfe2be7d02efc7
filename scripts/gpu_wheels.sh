#!/usr/bin/env bash
# Wheels the GPU image lacks (server stack, gguf, the HTTP client of samebits check, the grammar library of structured
# outputs and the JSON-schema validator its tests use), for Python 3.12 x86_64, into .whl/ (git-ignored; carry it).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  fastapi==0.165.0 uvicorn==0.54.0 pydantic==2.14.4 pydantic-core==2.50.5 starlette==1.10.0 \
  annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 opentelemetry-api==1.45.2 gguf==0.19.0 \
  httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 sniffio==1.3.1 certifi==2026.10.19.post1 idna==3.20 \
  jsonschema==4.26.0 attrs==26.1.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
# llguidance's one wheel (abi3, no dependencies) is built for glibc 2.31 and later, a tag of its own.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 -d .whl llguidance==1.9.1
# Ray for the fleet (samebits/fleet). Its wheel is 79 MB, 32 MB of it the Java workers' jar, which a Python fleet never
# starts: the jar and the dashboard's web client (include_dashboard=False) are left out of the copy carried.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 -d .whl \
  ray==2.60.0
python3 - <<'PY'
import glob, os, zipfile
for path in glob.glob(".whl/ray-2.60.0-*.whl"):
    dropped = ("ray/jars/", "ray/dashboard/client/build/")
    tmp = path + ".tmp"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename.startswith(dropped):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                gone = tuple(d.encode() for d in dropped)
                data = b"".join(line for line in data.splitlines(True) if not line.startswith(gone))
            dst.writestr(item, data)
    os.replace(tmp, path)
PY
ls .whl && du -ch .whl/*.whl | tail -1
