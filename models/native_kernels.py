"""The native CPU kernels (models/native/*.cc): compiled once for this CPU, registered with XLA.

Every `.cc` under models/native/ is an XLA FFI custom call (few-row matmuls, short-block
attention). They are compiled together on first use with the system C++ compiler for this CPU
(`-march=native`, a few seconds) into the asd-jax cache directory
(`models.registry.cache_root`), keyed by the sources, jax version, compiler, flags and CPU
flags. Where that is not possible a warning says so once and every caller uses its XLA
version; `ASD_JAX_NATIVE=0` chooses the XLA versions without a warning.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import warnings

import jax

from models.registry import cache_root

# exported handler symbol -> XLA custom-call target name
TARGETS = {
    "AsdFewRowsMatmul": "asd_few_rows_matmul",
    "AsdFewRowsMatmulTransposed": "asd_few_rows_matmul_transposed",
    "AsdFewRowsMatmulQ4_1": "asd_few_rows_matmul_q4_1",
    "AsdFewRowsMatmulTransposedQ8_0": "asd_few_rows_matmul_transposed_q8_0",
    "AsdBlockAttention": "asd_block_attention",
}
_NATIVE_DIR = pathlib.Path(__file__).parent / "native"
_SOURCES = tuple(sorted(_NATIVE_DIR.glob("*.cc")))
_HEADERS = tuple(sorted(_NATIVE_DIR.glob("*.h")))
_FLAGS = ("-O3", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC")


def find_compiler() -> str | None:
  """The C++ compiler the kernels are built with: $CXX (default g++), else c++; None if neither."""
  return shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")


def compiler_args(march: str = "native") -> list[str]:
  """The compiler's arguments for a build of every kernel for `march` (-march=), less -o."""
  return [*_FLAGS, f"-march={march}", f"-I{jax.ffi.include_dir()}", *(str(s) for s in _SOURCES)]


def _cpu_flags() -> str:
  try:
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
      if line.startswith("flags"):
        return line
  except OSError:
    pass
  return ""


def build_library() -> pathlib.Path:
  """Compiles the kernels once per (sources, jaxlib, compiler flags, CPU); returns the .so.

  Raises RuntimeError with the compiler's message when there is no compiler or the build fails.
  """
  compiler = find_compiler()
  if compiler is None:
    raise RuntimeError("no C++ compiler found (set CXX)")
  key = hashlib.sha256("\0".join(
      [*(s.read_text() for s in _SOURCES + _HEADERS), jax.__version__, compiler, *_FLAGS,
       _cpu_flags()]).encode())
  path = cache_root() / "native" / f"asd_kernels-{key.hexdigest()[:16]}.so"
  if path.exists():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
    built = pathlib.Path(tmp) / path.name
    proc = subprocess.run([compiler, *compiler_args(), "-o", str(built)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
      raise RuntimeError(f"{compiler} failed:\n{proc.stderr[-2000:]}")
    os.replace(built, path)  # atomic: concurrent builders (test workers) never see half a file
  return path


@functools.cache
def native_available() -> bool:
  """True once the kernels are compiled, loaded and registered for the CPU platform."""
  if os.environ.get("ASD_JAX_NATIVE", "1") == "0":
    return False
  try:
    library = ctypes.cdll.LoadLibrary(str(build_library()))
    for symbol, target in TARGETS.items():
      jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(library, symbol)),
                                  platform="cpu")
  except (OSError, RuntimeError, subprocess.SubprocessError) as err:
    warnings.warn(f"asd_jax: the native CPU kernels are unavailable, using XLA's versions "
                  f"({err})", RuntimeWarning, stacklevel=2)
    return False
  return True
