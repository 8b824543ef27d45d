"""PEP 517 build backend for the flashqla wheel (standard library only).

``pip install .`` builds the C++ core (``libflashqla``) and the torch binding
(``libflashqla_torch``) with CMake and packs them with the Python sources into a
wheel. It needs no build requirements from an index when the machine has cmake and
the target environment has torch: the binding is compiled against the torch that
the package will run with (found by asking the interpreter pip installs into),
rather than a second copy downloaded into an isolated build environment. Only when
that interpreter has no torch (or the machine no cmake) are ``torch`` / ``cmake``
requested as build requirements.

Environment:
  FLASHQLA_TORCH_DIR     torch package folder to build against (skips the search)
  FLASHQLA_ENABLE_CUDA   1/0: build the CUDA backend and sm_90a kernels (default: 1
                         when nvcc is found; CUTLASS headers are then fetched by
                         scripts/fetch_cutlass.sh unless already in third_party/)
  FLASHQLA_BUILD_DIR     CMake build folder (default: build/python in the source tree)
  FLASHQLA_JOBS          parallel build jobs (default: CPU count)
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "flashqla"
SUMMARY = "Gated Delta Network attention kernels (chunked prefill, forward and backward) for Hopper"


def _version() -> str:
    header = (ROOT / "include" / "flashqla" / "flashqla.h").read_text()
    parts = [re.search(rf"#define FLASHQLA_VERSION_{p} (\d+)", header).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _log(msg: str) -> None:
    print(f"flashqla build: {msg}", file=sys.stderr, flush=True)


# --- torch and tools -----------------------------------------------------------------

_PROBE = "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"


def _probe_torch(env: dict[str, str]) -> tuple[str, str] | None:
    try:
        out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.strip().splitlines()
    return (lines[-2], lines[-1]) if out.returncode == 0 and len(lines) >= 2 else None


def _target_env() -> dict[str, str]:
    """The environment without pip's build isolation. pip isolates a build by prepending
    its own folders through PYTHONPATH and hiding the interpreter's site-packages;
    without those variables the same interpreter sees the environment the wheel is being
    installed into. Tools run from there too (a pip-installed cmake is a Python script
    that needs its own package)."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def _find_torch() -> tuple[str, str] | None:
    """(torch package folder, version) of the environment being installed into, else of
    the build environment, else None."""
    explicit = os.environ.get("FLASHQLA_TORCH_DIR")
    if explicit:
        return explicit, "given by FLASHQLA_TORCH_DIR"
    return _probe_torch(_target_env()) or _probe_torch(dict(os.environ))


def _find_nvcc() -> str | None:
    nvcc = shutil.which("nvcc")
    if nvcc is None and Path("/usr/local/cuda/bin/nvcc").exists():
        nvcc = "/usr/local/cuda/bin/nvcc"
    return nvcc


def get_requires_for_build_wheel(config_settings=None) -> list[str]:
    requires = []
    if _find_torch() is None:
        requires.append("torch>=2.10")
    if shutil.which("cmake") is None:
        requires.append("cmake>=3.24")
    return requires


def get_requires_for_build_sdist(config_settings=None) -> list[str]:
    return []


# --- metadata ------------------------------------------------------------------------

def _metadata() -> str:
    readme = (ROOT / "README.md").read_text()
    return "\n".join([
        "Metadata-Version: 2.1",
        f"Name: {NAME}",
        f"Version: {_version()}",
        f"Summary: {SUMMARY}",
        "License: Apache-2.0",
        "Requires-Python: >=3.9",
        "Requires-Dist: torch>=2.10",
        "Description-Content-Type: text/markdown",
        "",
        readme,
    ])


def _wheel_tag() -> str:
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    # The compiled parts use no Python C API (the binding is loaded by torch), so one
    # wheel serves every Python 3.
    return f"py3-none-{platform}"


def _dist_info() -> str:
    return f"{NAME}-{_version()}.dist-info"


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None) -> str:
    target = Path(metadata_directory) / _dist_info()
    target.mkdir(parents=True, exist_ok=True)
    (target / "METADATA").write_text(_metadata())
    (target / "WHEEL").write_text(_wheel_file())
    return _dist_info()


def _wheel_file() -> str:
    return f"Wheel-Version: 1.0\nGenerator: flashqla_build\nRoot-Is-Purelib: false\nTag: {_wheel_tag()}\n"


# --- native build --------------------------------------------------------------------

def _cmake_build(torch_dir: str) -> Path:
    build = Path(os.environ.get("FLASHQLA_BUILD_DIR", ROOT / "build" / "python"))
    nvcc = _find_nvcc()
    cuda = os.environ.get("FLASHQLA_ENABLE_CUDA", "1" if nvcc else "0") not in ("0", "OFF", "off", "")
    args = ["cmake", "-S", str(ROOT), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
            "-DFLASHQLA_BUILD_TESTS=OFF", "-DFLASHQLA_BUILD_EXAMPLES=OFF", "-DFLASHQLA_BUILD_TORCH_BINDING=ON",
            f"-DFLASHQLA_TORCH_DIR={torch_dir}", f"-DFLASHQLA_ENABLE_CUDA={'ON' if cuda else 'OFF'}"]
    if cuda:
        if not nvcc:
            raise RuntimeError("FLASHQLA_ENABLE_CUDA=1 but nvcc was not found")
        if not (ROOT / "third_party" / "cutlass" / "include" / "cute" / "tensor.hpp").exists():
            subprocess.run(["bash", str(ROOT / "scripts" / "fetch_cutlass.sh")], check=True, stdout=sys.stderr,
                           env=_target_env())
        args.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    if shutil.which("ninja"):
        args += ["-G", "Ninja"] if not (build / "CMakeCache.txt").exists() else []
    _log(f"building the core ({'with' if cuda else 'without'} CUDA) and the torch binding in {build}")
    subprocess.run(args, check=True, stdout=sys.stderr, env=_target_env())
    jobs = os.environ.get("FLASHQLA_JOBS", str(os.cpu_count() or 2))
    subprocess.run(["cmake", "--build", str(build), "-j", jobs], check=True, stdout=sys.stderr, env=_target_env())
    return build


def _native_files(build: Path) -> dict[str, Path]:
    """Archive name -> built file, for the two shared libraries."""
    binding = build / "binding" / "torch" / "libflashqla_torch.so"
    core = build / "libflashqla.so.0"
    for f in (binding, core):
        if not f.exists():
            raise RuntimeError(f"expected build output missing: {f}")
    return {"flashqla/_lib/libflashqla_torch.so": binding, "flashqla/_lib/libflashqla.so.0": core.resolve()}


def _python_files() -> dict[str, Path]:
    src = ROOT / "python" / "flashqla"
    return {f"flashqla/{p.relative_to(src).as_posix()}": p for p in sorted(src.rglob("*.py"))}


# --- wheel ---------------------------------------------------------------------------

def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None) -> str:
    found = _find_torch()
    if found is None:
        raise RuntimeError("flashqla needs torch >= 2.10 to build its binding; install torch first")
    torch_dir, torch_version = found
    _log(f"building against torch {torch_version} at {torch_dir}")
    build = _cmake_build(torch_dir)
    files = {**_python_files(), **_native_files(build)}
    wheel_name = f"{NAME}-{_version()}-{_wheel_tag()}.whl"
    path = Path(wheel_directory) / wheel_name
    records = []
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for arcname, src in files.items():
            data = src.read_bytes()
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if arcname.endswith(".so") or ".so." in arcname else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
            records.append(_record_line(arcname, data))
        for name, text in (("METADATA", _metadata()), ("WHEEL", _wheel_file())):
            data = text.encode()
            zf.writestr(f"{_dist_info()}/{name}", data)
            records.append(_record_line(f"{_dist_info()}/{name}", data))
        records.append(f"{_dist_info()}/RECORD,,")
        zf.writestr(f"{_dist_info()}/RECORD", "\n".join(records) + "\n")
    _log(f"wrote {path}")
    return wheel_name


# --- sdist ---------------------------------------------------------------------------

def _source_files() -> list[str]:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True, check=True)
        return [f for f in out.stdout.splitlines() if (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):
        skip = {"build", "third_party", ".git", ".venv", "dist"}
        return [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*")
                if p.is_file() and not (set(p.relative_to(ROOT).parts) & skip)]


def build_sdist(sdist_directory, config_settings=None) -> str:
    base = f"{NAME}-{_version()}"
    path = Path(sdist_directory) / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for rel in _source_files():
            tf.add(ROOT / rel, arcname=f"{base}/{rel}")
        pkg_info = _metadata().encode()
        info = tarfile.TarInfo(f"{base}/PKG-INFO")
        info.size = len(pkg_info)
        tf.addfile(info, io.BytesIO(pkg_info))
    return path.name
