"""Process-wide settings and housekeeping for every test worker."""

import atexit
import gc
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

# Tests that need several devices set this before importing jax; keep the default elsewhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU compiles the tests' programs for compile speed, not run speed: without LLVM's
# optimisation passes (level 0; jax's default is 3), with XLA's older loop emitters instead of
# its fusion emitters, and as one LLVM module instead of several compiled on parallel threads
# (two pytest workers already fill two cores). Compiling is most of the suite's time: the
# models are tiny, so their programs run in milliseconds, and each new shape or option is a new
# program. Seconds of backend compile per program (tests' tiny models, 3 repeats, one session):
#   flags                                 chain loop   tree loop   VSD loss gradient
#   jax's defaults (level 3)              2.7-2.9      3.6-3.9     12.3-17.8
#   level 0                               2.4-2.6      2.7-3.0      6.5-7.4
#   level 0, no fusion emitters, 1 split  0.9-1.0      1.4          3.9-4.2
# The whole suite on a 2-core machine (clean clone): 1,596-1,703 s at level 0 alone, 1,078-1,241 s
# with all three. What runs long rather than compiles gets no faster: the real-model test
# (tests/test_smollm2_spec.py) took 98-157 s a case with them, 83-118 s at level 0 alone.
# The price: this build rounds differently from jax's default in the last bits (three tiny VSD
# training steps' parameters up to 1.2e-7 apart, a tiny ASD decode's log-probabilities up to
# 9.5e-7, measured with all three flags against the defaults), so the
# exactness tests (speculative == plain greedy) check this build; both sides of each
# comparison are compiled alike, which is what they need. `XLA_FLAGS=
# --xla_backend_optimization_level=3 make test` runs them as shipped: when the caller sets a
# level, none of these flags is added. The tests' subprocesses inherit the flags.
_COMPILE_FAST = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false",
                 "--xla_cpu_parallel_codegen_split_count=1")


def _xla_accepts(flags: str) -> bool:
  """XLA aborts the process on a flag it does not know, and the emitter flag is young (newer
  XLA may drop it), so a throwaway process tries the flags first."""
  env = {**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"}
  try:
    return subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], env=env,
                          capture_output=True, timeout=300).returncode == 0
  except subprocess.TimeoutExpired:
    return False


# The first pytest process (xdist's controller) decides; its workers inherit the result.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  _caller = os.environ.get("XLA_FLAGS", "")
  _wanted = " ".join(filter(None, [_caller, *_COMPILE_FAST]))
  os.environ["XLA_FLAGS"] = (_wanted if _xla_accepts(_wanted) else
                             " ".join(filter(None, [_caller, _COMPILE_FAST[0]])))
# In-process CLI calls would point jax's persistent compilation cache at the user's cache folder
# for the whole worker (asd_jax.cli_common.enable_compilation_cache); they leave it alone here.
os.environ.setdefault("ASD_JAX_COMPILATION_CACHE", "0")
# Instead the test run keeps the programs it compiles in one folder of its own, deleted at exit:
# made by the first test process (pytest-xdist's controller, which starts the workers) and shared
# by the workers and the subprocesses they start. A test that calls a CLI several times builds
# new model functions each call, so jit's in-memory cache misses and XLA would compile the same
# program again (tests/test_generate_cli.py's prompts-file test: 76 s -> 47 s); so do the
# training runs that a resume test starts one after another. With one folder a program either
# worker wrote serves both (few do: 360 persistent-cache hits in a whole run, 355 with a folder
# per worker). Sharing is safe because of the size cap: only with one does jax hold a file lock
# around each read and write of the folder (jax/_src/lru_cache.py), so no process loads a
# program another is half-way through writing.
# Programs with host callbacks (streams, stop strings) are never cached (jax's rule).
# A folder set by the caller is kept.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _COMPILED = tempfile.mkdtemp(prefix="asd-jax-tests-xla-")
  atexit.register(shutil.rmtree, _COMPILED, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _COMPILED
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(8 << 30))
# Skips the many small eager programs, whose compile costs less than an entry's write.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.25")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Frees each module's compiled XLA programs when the module is done.

  Every XLA:CPU executable holds ~36 memory mappings (its JIT-linked code and data), and a
  pytest-xdist worker lives for the whole suite: ~1,800 live executables reach Linux's default
  vm.max_map_count (65,530), after which the next compile's mmap fails and XLA segfaults. That
  crashed a worker in the VSD tests late in `make test`, in CI and here (a worker had 52,000
  mappings at 70% of the suite).
  """
  yield
  import jax
  jax.clear_caches()
  gc.collect()


@pytest.fixture(scope="module")
def no_compilation_cache_writes():
  """For a module whose programs close over large arrays: XLA bakes them in as constants, and
  writing such a program to the persistent cache (serialize, zlib, ~80 MB each for
  tests/test_weight_blocks.py's 49152-row head) took longer than compiling it: 22 s -> 96 s.
  Reads stay on."""
  import jax
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", float("inf"))
  yield
  jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


@pytest.fixture
def shipped_build():
  """Compiler options that undo the compile-fast flags above, for `.lower(...).compile(
  shipped_build)` in a test about the program users get: without XLA's fusion emitters the
  chain loop copies its KV cache (16 copies), with them (jax's default) it updates it in place.
  The codegen split is left as set: it only divides the finished program among LLVM modules."""
  flags = os.environ.get("XLA_FLAGS", "")
  shipped = {"xla_backend_optimization_level": 3, "xla_cpu_use_fusion_emitters": True}
  return {name: value for name, value in shipped.items() if f"--{name}=" in flags}


@pytest.fixture
def no_model_load(monkeypatch):
  """Fails a test whose CLI loads the model or tokenizer: flags must be checked first, so a
  typo costs milliseconds, not a model load."""
  import models.load
  import models.tokenizer

  def no_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the flags were checked")

  monkeypatch.setattr(models.load, "load_decoder", no_load)
  monkeypatch.setattr(models.tokenizer, "load_tokenizer", no_load)
