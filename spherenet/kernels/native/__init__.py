"""The native CPU kernel of the sphere-Adam step (``sphere_adam.cpp`` beside this file), compiled on first use.

The sphere Adam step puts row reductions (tangent projection, retraction norm, transport)
between its elementwise stages. As ``torch._foreach_*`` calls that is about a dozen passes over
memory; the native kernel does the whole step for one row while the row sits in cache, so it
streams each tensor once, like ``torch.optim.Adam(fused=True)``.

It is built with ``torch.utils.cpp_extension`` (a C++17 compiler and ninja are needed; the
``ninja`` package is a dependency of spherenet) into ``TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``), once per machine. Building is skipped, and the optimizers use
the torch kernels, when ``SPHERENET_KERNELS`` is ``torch`` or ``reference`` (see
:mod:`spherenet.kernels.resolve`).
The module name carries the CPU instruction set torch selected (``AVX2``, ``AVX512``, ...), so
one cache directory shared by different machines never loads code built for another CPU, and a
hash of the source, the flags and the torch version, so a library found there under that name
is this build's: it is loaded directly, without torch's builder. (The builder holds a lock file
in the build folder while it checks the build; a process killed meanwhile leaves the file behind,
and every later builder would wait on it forever: a lock older than ``_STALE_LOCK_S`` is removed,
with a warning, before building.)
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import torch

from spherenet.kernels import resolve

__all__ = ["sphere_adam_op", "native_status", "cpu_build_flags", "NATIVE_DTYPES"]

log = logging.getLogger(__name__)

# SPHERENET_KERNELS values that keep every op in torch: the kernel is then never built.
_EXCLUDING_NATIVE = ("torch", "reference")
NATIVE_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_SOURCE = Path(__file__).parent / "sphere_adam.cpp"
# Compiler flags per CPU capability, and the CPU_CAPABILITY macros that make ATen's Vectorized<T>
# use those lanes (as torch's own kernels are built); anything else gets the portable DEFAULT.
_ISA_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2"],
}


def _isa_flags(capability: str) -> list[str]:
    if capability not in _ISA_FLAGS:
        return ["-DCPU_CAPABILITY=DEFAULT", "-DCPU_CAPABILITY_DEFAULT"]
    return [*_ISA_FLAGS[capability], f"-DCPU_CAPABILITY={capability}", f"-DCPU_CAPABILITY_{capability}"]


def cpu_build_flags() -> list[str]:
    """The compiler flags the kernel is built with on this CPU: optimization, OpenMP and the
    vector instructions of torch's CPU capability (as ATen's own kernels are built)."""
    return ["-O3", "-fopenmp", "-fno-math-errno", *_isa_flags(_cpu_capability())]


# A build takes a minute or two; a lock this old was left by a killed process.
_STALE_LOCK_S = 15 * 60


def _remove_stale_lock(build_directory: Path, now: float | None = None) -> bool:
    """Remove torch's builder lock in ``build_directory`` if it is older than ``_STALE_LOCK_S``
    (its holder was killed); a younger one is left to the build that holds it."""
    lock_file = build_directory / "lock"
    try:
        age = (time.time() if now is None else now) - lock_file.stat().st_mtime
    except FileNotFoundError:
        return False
    if age < _STALE_LOCK_S:
        return False
    log.warning(
        "spherenet: removing %s, a build lock left %.0f minutes ago by a process that ended", lock_file, age / 60
    )
    lock_file.unlink(missing_ok=True)
    return True


_lock = threading.Lock()
_state: dict = {"tried": False, "op": None, "reason": None}


def _cpu_capability() -> str:
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # pragma: no cover - very old torch
        return "DEFAULT"


def _module_name(flags: list[str]) -> str:
    """The kernel's module name on this CPU: its capability, and a hash of the source, the
    compiler ``flags`` and the torch version, so checkouts of different versions (and ISA flags,
    and torch versions) build into their own folders of torch's extension cache, never over each
    other's library."""
    key = _SOURCE.read_bytes() + " ".join(flags + [torch.__version__]).encode()
    return f"spherenet_sphere_adam_{_cpu_capability().lower()}_{hashlib.sha256(key).hexdigest()[:12]}"


def _ninja_folder() -> str | None:
    """Where torch's builder can find ``ninja``: ``""`` when it is on PATH already, else the
    folder next to this Python (an unactivated venv) or the ``ninja`` package's, else ``None``."""
    if shutil.which("ninja"):
        return ""
    candidates = [os.path.dirname(sys.executable)]
    try:
        import ninja  # the PyPI package ships the binary

        candidates.append(ninja.BIN_DIR)
    except Exception:
        pass
    return next((folder for folder in candidates if folder and shutil.which("ninja", path=folder)), None)


def _build():
    if resolve.environment() in _EXCLUDING_NATIVE:
        return None, f"disabled by {resolve.ENVIRONMENT_VARIABLE}={resolve.environment()}"
    if not hasattr(torch.ops, "spherenet") or not hasattr(torch.ops.spherenet, "sphere_adam_"):
        ninja_folder = _ninja_folder()
        if ninja_folder is None:
            return None, "ninja was not found (pip install ninja)"
        if not _SOURCE.is_file():
            return None, f"kernel source {_SOURCE} is missing from the installation"
        from torch.utils.cpp_extension import _get_build_directory, load

        flags = cpu_build_flags()  # one list for the name's hash and the compiler
        name = _module_name(flags)
        build_directory = Path(_get_build_directory(name, verbose=False))
        built = build_directory / f"{name}.so"
        if built.is_file():
            try:
                torch.ops.load_library(str(built))
                return torch.ops.spherenet.sphere_adam_, None
            except (OSError, RuntimeError, AttributeError) as exc:  # a truncated file: build again
                log.warning("spherenet: could not load %s (%s); building it again", built, exc)
        _remove_stale_lock(build_directory)
        log.info("spherenet: building the native sphere-Adam kernel %s (once per machine)", name)
        path = os.environ.get("PATH", "")
        if ninja_folder:  # torch runs `ninja` from PATH: extend it for the build only
            os.environ["PATH"] = ninja_folder + os.pathsep + path
        try:
            load(name=name, sources=[str(_SOURCE)], extra_cflags=flags, is_python_module=False, verbose=False)
        except Exception as exc:  # a compiler error, a missing compiler, a read-only cache ...
            lines = str(exc).strip().splitlines()
            return None, f"building {name} failed: {lines[-1] if lines else type(exc).__name__}"
        finally:
            os.environ["PATH"] = path
    return torch.ops.spherenet.sphere_adam_, None


def sphere_adam_op():
    """The ``torch.ops.spherenet.sphere_adam_`` operator, building it on the first call, or
    ``None`` if it cannot be had (:func:`native_status` says why)."""
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["op"], _state["reason"] = _build()
                _state["tried"] = True
    return _state["op"]


def native_status() -> tuple[bool, str | None]:
    """``(available, reason it is not)``, building the kernel if that was not tried yet."""
    op = sphere_adam_op()
    return op is not None, _state["reason"]
