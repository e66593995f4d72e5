"""Shared fixtures: tiny random models built from transformers configs (CPU torch reference)."""

import os

# Tests that need several devices set this before importing jax; keep the default elsewhere.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
