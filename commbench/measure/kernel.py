"""Build driver for the package's C kernels, and the ctypes binding of the fp8 codec kernel.

The C sources are package data (``commbench/measure/kernels/*.c``). :func:`build` compiles one with the system C
compiler (``cc -O3 -march=native -fopenmp``) on first use, caches the shared object under
``$XDG_CACHE_HOME/commbench`` or ``~/.cache/commbench`` (keyed by source, compiler, flags and CPU, so a changed
source or machine never loads a stale build) and loads it with ctypes, which releases the GIL during calls.
OpenMP resolves to torch's own libgomp. Any failure is reported as a reason string and the numerics fall back
to pure torch (:mod:`commbench.measure.fp8`), which gives identical bits; ``COMMBENCH_FP8_KERNEL=0`` disables it.

This module knows nothing about fp8 formats: the binding takes the integer codes the C file defines.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the thread count is asked of torch when the kernel runs; importing this module needs none
    import torch

FLAGS: tuple[str, ...] = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-fast-math", "-ffp-contract=off")


class KernelUnavailable(Exception):
    """The kernel could not be built or loaded; the message says why (shown by ``kernel_status``)."""


def source_text(name: str) -> str:
    """Text of the packaged C source ``commbench/measure/kernels/<name>``."""
    return (resources.files("commbench.measure") / "kernels" / name).read_text()


def _cpu_signature() -> str:
    """What -march=native depends on (model and flags; not the ever-changing MHz line)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return platform.machine()
    keep = [
        ln
        for ln in text.split("\n\n")[0].splitlines()
        if ln.split(":")[0].strip() in ("model name", "flags", "Features")
    ]
    return platform.machine() + "\n".join(keep)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "commbench"


_COMPILER: dict[str, str] = {}


def compiler_version(cc: str) -> str:
    """``cc``'s name and the first line of ``cc --version`` (what decides the kernel's speed), cached."""
    if cc not in _COMPILER:
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=20).stdout
            first = out.strip().splitlines()[0] if out.strip() else "version unknown"
        except (OSError, subprocess.SubprocessError):
            first = "version unknown"
        _COMPILER[cc] = f"{Path(cc).name}: {first}"
    return _COMPILER[cc]


def find_compiler() -> str | None:
    """The C compiler a build uses: ``$CC`` (default ``cc``), else ``gcc``; None when there is none."""
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


def build(name: str) -> ctypes.CDLL:
    """Compile (or reuse the cached build of) ``commbench/measure/kernels/<name>`` and load it.

    Raises :class:`KernelUnavailable` with the reason when there is no compiler or the build fails.
    """
    cc = find_compiler()
    if cc is None:
        raise KernelUnavailable("no C compiler found")
    try:
        source = source_text(name)
    except OSError as e:
        raise KernelUnavailable(f"kernel source {name} missing from the package: {e}") from e
    stem = Path(name).stem
    key = hashlib.sha256("\0".join([source, cc, *FLAGS, _cpu_signature()]).encode()).hexdigest()[:16]
    cache = cache_dir()
    so = cache / f"{stem}_{key}.so"
    try:
        if not so.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory() as tmp:
                src = Path(tmp) / name
                src.write_text(source)
                built = Path(tmp) / f"{stem}.so"
                cmd = [cc, *FLAGS, str(src), "-o", str(built), "-lm"]
                subprocess.run(cmd, check=True, capture_output=True, timeout=120)
                # Atomic publish: concurrent ranks may build at the same time.
                part = cache / f".{so.name}.{os.getpid()}"
                shutil.copyfile(built, part)
                os.replace(part, so)
        return ctypes.CDLL(str(so))
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"could not build the {stem} kernel: {e}") from e


# ----------------------------------------------------------------------------------------------------------
# The fp8 codec kernel (kernels/fp8.c): format code 0 e4m3, 1 e5m2; mode 0 tensor, 1 block, 2 none.

PARALLEL_MIN = 1 << 18
"""Elements below which the kernel stays on the calling thread: waking an OpenMP team costs more than it saves
(and on a loaded machine can cost a scheduler tick)."""


def _threads(n: int) -> int:
    import torch

    return torch.get_num_threads() if n >= PARALLEL_MIN else 1


class NoFp8Kernel:
    """Stand-in when the C kernel is disabled or could not be built."""

    error: str | None = "disabled"
    compiler: str | None = None

    def available(self, device: torch.device) -> bool:
        return False

    def runs_on(self, device: torch.device) -> bool:
        """Whether the kernel could run on tensors of ``device`` at all: host memory only (the one place that
        knows which devices the C kernel reads)."""
        return device.type == "cpu"

    def unavailable_reason(self, device: torch.device) -> str | None:
        """Why the kernel does not run on ``device`` (None when it does)."""
        if self.available(device):
            return None
        return self.error if self.runs_on(device) else f"the C kernel is CPU-only, this is {device.type}"

    def quantize(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, fmt: int, mode: int, block: int) -> None:
        raise RuntimeError("fp8 kernel unavailable")

    def dequantize(
        self, q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, fmt: int, block: int, accumulate: bool
    ) -> None:
        raise RuntimeError("fp8 kernel unavailable")


class Fp8Kernel(NoFp8Kernel):
    """ctypes binding of ``kernels/fp8.c``; built lazily, CPU tensors only.

    ``block`` is the run of elements sharing one scale (the whole tensor for one scale).
    """

    def __init__(self) -> None:
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self.error = None
        self.compiler = None  # the compiler that built the loaded kernel (name and version line)

    def _load(self) -> ctypes.CDLL | None:
        self._tried = True
        if os.environ.get("COMMBENCH_FP8_KERNEL", "1") == "0":
            self.error = "disabled by COMMBENCH_FP8_KERNEL=0"
            return None
        try:
            lib = build("fp8.c")
        except KernelUnavailable as e:
            self.error = str(e)
            return None
        cc = find_compiler()
        self.compiler = compiler_version(cc) if cc else None
        i64, ptr, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
        lib.cb_fp8_quantize.argtypes = [ptr, ptr, ptr, i64, i64, cint, cint, cint]
        lib.cb_fp8_quantize.restype = cint
        lib.cb_fp8_dequantize.argtypes = [ptr, ptr, ptr, i64, i64, cint, cint, cint]
        lib.cb_fp8_dequantize.restype = None
        return lib

    def available(self, device: torch.device) -> bool:
        if not self.runs_on(device):
            return False
        if not self._tried:
            self._lib = self._load()
        return self._lib is not None

    def quantize(self, x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, fmt: int, mode: int, block: int) -> None:
        assert self._lib is not None  # callers check available() first
        n = x.numel()
        self._lib.cb_fp8_quantize(x.data_ptr(), q.data_ptr(), scales.data_ptr(), n, block, fmt, mode, _threads(n))

    def dequantize(
        self, q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor, fmt: int, block: int, accumulate: bool
    ) -> None:
        assert self._lib is not None
        n = q.numel()
        self._lib.cb_fp8_dequantize(
            q.data_ptr(), scales.data_ptr(), out.data_ptr(), n, block, fmt, int(accumulate), _threads(n)
        )
