"""Shared plumbing for the command-line tools: errors as one line, JAX setup, prompt encoding."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np


def run_cli(main):
  """Runs `main()`; a ValueError/TypeError/FileNotFoundError becomes a one-line error, exit 2."""

  @functools.wraps(main)
  def wrapper(argv=None):
    try:
      return main(argv)
    except (ValueError, TypeError, FileNotFoundError) as e:
      print(f"error: {e}", file=sys.stderr)
      raise SystemExit(2)

  return wrapper


def enable_compilation_cache() -> None:
  """Persists compiled programs across CLI runs (a second `generate` skips most compilation)."""
  import jax
  from platformdirs import user_cache_dir

  root = os.environ.get("ASD_JAX_CACHE_DIR") or user_cache_dir("asd-jax")
  jax.config.update("jax_compilation_cache_dir", os.path.join(root, "xla"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def parse_prompt_ids(text: str) -> list[int]:
  try:
    ids = [int(x) for x in text.replace(" ", "").split(",") if x != ""]
  except ValueError:
    raise ValueError(f"--prompt-ids must be comma-separated integers, got {text!r}") from None
  if not ids:
    raise ValueError("empty prompt: --prompt-ids has no ids")
  return ids


def right_pad(rows: list[list[int]], bucket: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token rows to a width rounded up to `bucket` (fewer distinct compiled shapes)."""
  lengths = np.array([len(r) for r in rows], np.int32)
  width = max(1, -(-int(lengths.max()) // bucket) * bucket)
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, lengths
