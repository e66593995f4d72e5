"""The native kernels build: for this CPU, and for every x86 vector width they have code for.

native_available() falls back to XLA's versions with a warning when the build fails, and the
kernel tests then skip, so a compile error would pass the suite unnoticed. Once a cast that is
valid only for 8-lane vectors broke the AVX-512 build while the suite ran on an AVX2 CPU; the
syntax-only builds below check every width on any x86 machine.
"""

from __future__ import annotations

import os
import platform
import subprocess

import pytest

from models import native_kernels

COMPILER = native_kernels.find_compiler()
ON_X86 = platform.machine() in ("x86_64", "AMD64", "i686")

pytestmark = [
    pytest.mark.skipif(COMPILER is None, reason="no C++ compiler: the XLA versions are used"),
    pytest.mark.skipif(not ON_X86, reason="the kernels' vector code is written for x86"),
]

# SSE only (4 lanes); AVX without AVX2/FMA (8 lanes, scalar widening); AVX2 + FMA + F16C;
# AVX-512 (16 lanes).
X86_TARGETS = ("x86-64-v2", "sandybridge", "haswell", "skylake-avx512")


@pytest.mark.parametrize("march", X86_TARGETS)
def test_kernels_compile_for_each_x86_vector_width(march):
  proc = subprocess.run([COMPILER, *native_kernels.compiler_args(march), "-fsyntax-only"],
                        capture_output=True, text=True)
  assert proc.returncode == 0, f"-march={march}:\n{proc.stderr[-3000:]}"


@pytest.mark.skipif(os.environ.get("ASD_JAX_NATIVE") == "0", reason="ASD_JAX_NATIVE=0")
def test_kernels_build_and_register_for_this_cpu():
  assert native_kernels.build_library().exists()  # raises with the compiler's message
  assert native_kernels.native_available()
