"""Process-wide settings for every test worker (set before any test imports jax)."""

import os

# Tests that need several devices set this before importing jax; keep the default elsewhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# In-process CLI calls would switch on jax's persistent compilation cache for the whole worker
# (see asd_jax.cli_common.enable_compilation_cache); tests compile afresh instead.
os.environ.setdefault("ASD_JAX_COMPILATION_CACHE", "0")
