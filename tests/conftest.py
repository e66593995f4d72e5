"""Process-wide settings and housekeeping for every test worker."""

import gc
import os

import pytest

# Tests that need several devices set this before importing jax; keep the default elsewhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# In-process CLI calls would switch on jax's persistent compilation cache for the whole worker
# (see asd_jax.cli_common.enable_compilation_cache); tests compile afresh instead.
os.environ.setdefault("ASD_JAX_COMPILATION_CACHE", "0")


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
