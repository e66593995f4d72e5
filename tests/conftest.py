"""Process-wide settings and housekeeping for every test worker."""

import atexit
import gc
import os
import shutil
import tempfile

import pytest

# Tests that need several devices set this before importing jax; keep the default elsewhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA:CPU compiles the tests' programs without LLVM's optimisation passes (level 0; jax's
# default is 3). Compiling is most of the suite's time: the models are tiny, so their programs
# run in milliseconds, and each new shape or option is a new program. At level 0 a compile is
# ~2.2x faster (tiny chain loop 3.9 -> 1.8 s, tree loop 4.7 -> 2.6 s, VSD loss gradient
# 14 -> 6 s), and the whole suite took 1,703 s instead of 2,016 s on a 2-core machine; the few
# tests that run many steps (sampling statistics) run up to ~1.4x longer. The price: levels
# 0-2 round differently from 3 in the last bits (VSD parameters after 3 steps ~1e-8 apart,
# log-probabilities <= 5e-7), so the exactness tests (speculative == plain greedy) check the
# level-0 build; both sides of each comparison are compiled alike, which is what they need.
# `XLA_FLAGS=--xla_backend_optimization_level=3 make test` runs them as shipped: a level set by
# the caller is kept. The tests' subprocesses inherit the flag.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = " ".join(filter(None, [os.environ.get("XLA_FLAGS"),
                                                   "--xla_backend_optimization_level=0"]))
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
def no_model_load(monkeypatch):
  """Fails a test whose CLI loads the model or tokenizer: flags must be checked first, so a
  typo costs milliseconds, not a model load."""
  import models.load
  import models.tokenizer

  def no_load(*args, **kwargs):
    raise AssertionError("the model was loaded before the flags were checked")

  monkeypatch.setattr(models.load, "load_decoder", no_load)
  monkeypatch.setattr(models.tokenizer, "load_tokenizer", no_load)
