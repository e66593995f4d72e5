"""Compiled XLA:CPU programs against Linux's limit on memory mappings per process.

An XLA:CPU program keeps every JIT-compiled kernel in its own mappings (code, read-only data,
writable data): measured here, ~400 mappings for a plain decode loop and more for a
speculative one, whatever the model size. Linux refuses a process more than vm.max_map_count
mappings (65,530 by default), and LLVM then aborts the whole process with "Unable to allocate
section memory". A benchmark compiles one program per (row, prompt width): 16 rows x 4 widths
held ~40,000 mappings, and all 244 MT-Bench + HumanEval prompts span 8 widths. So a long run
drops the programs it no longer needs before it nears the limit. Dropping costs a recompile
(a load from the persistent compilation cache when that is on), never a wrong result.
"""

from __future__ import annotations

MAPS_FILE = "/proc/self/maps"
LIMIT_FILE = "/proc/sys/vm/max_map_count"
# Release when half the limit is used: what one prompt width needs for all of a suite's rows
# (~16 x 700 mappings) must still fit after the check.
RELEASE_SHARE = 0.5


def memory_map_count() -> int | None:
  """This process's memory mappings (None where /proc is missing, i.e. not Linux)."""
  try:
    with open(MAPS_FILE, "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def memory_map_limit() -> int | None:
  """vm.max_map_count (None where it cannot be read)."""
  try:
    with open(LIMIT_FILE) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def release_compiled_programs() -> None:
  """Drops every compiled program of this process (jax.clear_caches); later calls recompile."""
  import jax
  jax.clear_caches()


def release_if_near_limit(share: float = RELEASE_SHARE) -> bool:
  """Releases the compiled programs when the mappings exceed `share` of the limit.

  Returns whether it released. Call it only between timed calls: the next call recompiles.
  """
  count, limit = memory_map_count(), memory_map_limit()
  if count is None or limit is None or count <= share * limit:
    return False
  release_compiled_programs()
  return True
