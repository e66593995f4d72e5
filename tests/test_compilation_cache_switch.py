"""ASD_JAX_COMPILATION_CACHE: the CLIs' persistent compilation cache goes where
ASD_JAX_CACHE_DIR says, stays off at 0, keeps to ASD_JAX_COMPILATION_CACHE_MB under a file lock,
drops an entry a killed run left unfinished, and a bad value is a clear error. Each case runs
in a fresh interpreter, because the jax settings it changes are process-wide."""

import os
import re
import subprocess
import sys

import pytest

PROBE = ("import jax; from asd_jax.cli_common import enable_compilation_cache; "
         "enable_compilation_cache(); print(jax.config.jax_compilation_cache_dir)")


# Eight programs, each holding a different 1 MiB table as a constant, so each cache entry is
# ~1 MB (random floats do not compress).
EIGHT_PROGRAMS = """
import jax, jax.numpy as jnp, numpy as np
from asd_jax.cli_common import enable_compilation_cache
enable_compilation_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # write even quick compiles
rng = np.random.default_rng(0)
for i in range(8):
  table = jnp.asarray(rng.standard_normal((256, 1024), dtype=np.float32))
  jax.jit(lambda x, t=table: x @ t.T + i + OFFSET)(jnp.ones((2, 1024))).block_until_ready()
"""


def _programs(offset: int = 0) -> str:
  """EIGHT_PROGRAMS, made different from another offset's (a new cache key each)."""
  return EIGHT_PROGRAMS.replace("OFFSET", str(offset))


def _probe(tmp_path, switch, code=PROBE, **env_vars):
  env = dict(os.environ, ASD_JAX_CACHE_DIR=str(tmp_path), ASD_JAX_COMPILATION_CACHE=switch,
             **env_vars)
  # tests/conftest.py's own folder and size for the suite
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  env.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)
  return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                        timeout=120)


@pytest.mark.parametrize("switch, expected", [("1", "{root}/xla"), ("0", "None")])
def test_switch_turns_the_persistent_cache_on_and_off(tmp_path, switch, expected):
  run = _probe(tmp_path, switch)
  assert run.returncode == 0, run.stderr
  assert run.stdout.strip() == expected.format(root=tmp_path)


def test_other_values_are_refused(monkeypatch):
  from asd_jax.cli_common import enable_compilation_cache
  monkeypatch.setenv("ASD_JAX_COMPILATION_CACHE", "yes")
  with pytest.raises(ValueError, match="ASD_JAX_COMPILATION_CACHE must be 0 or 1, got 'yes'"):
    enable_compilation_cache()


def test_the_cache_keeps_to_its_size_under_a_lock(tmp_path):
  run = _probe(tmp_path, "1", _programs(), ASD_JAX_COMPILATION_CACHE_MB="2")
  assert run.returncode == 0, run.stderr
  folder = tmp_path / "xla"
  entries = sorted(folder.glob("*-cache"))
  # Eight ~1 MB programs were written; the least recently used went to stay within 2 MB.
  assert 1 <= len(entries) <= 2, [e.name for e in entries]
  assert sum(e.stat().st_size for e in entries) <= 2 << 20
  # The file jax locks around every read and write: concurrent runs never see half an entry.
  assert (folder / ".lockfile").exists()


@pytest.mark.parametrize("megabytes", ["0", "-5", "1.5", "lots", ""])
def test_a_bad_size_is_refused(monkeypatch, megabytes):
  from asd_jax.cli_common import enable_compilation_cache
  monkeypatch.setenv("ASD_JAX_COMPILATION_CACHE", "1")
  monkeypatch.setenv("ASD_JAX_COMPILATION_CACHE_MB", megabytes)
  with pytest.raises(ValueError, match="ASD_JAX_COMPILATION_CACHE_MB must be a whole number of "
                     f"megabytes above 0, got '{re.escape(megabytes)}'"):
    enable_compilation_cache()


def test_an_entry_whose_write_never_finished_does_not_stop_later_writes(tmp_path):
  # jax writes an entry's program, then its access time; a run killed in between (or a jax
  # program writing to the folder without a size cap) leaves a program without one. jax's
  # eviction reads every entry's access time before each write, so that one file made every
  # later write fail with a warning: no program of the folder's owner was cached again.
  run = _probe(tmp_path, "1", _programs(0), ASD_JAX_COMPILATION_CACHE_MB="64")
  assert run.returncode == 0, run.stderr
  folder = tmp_path / "xla"
  tables = sorted(folder.glob("jit__lambda-*-cache"))  # the eight; jnp.ones etc. are cached too
  assert len(tables) == 8
  unfinished = tables[0].name.removesuffix("-cache")
  (folder / f"{unfinished}-atime").unlink()

  run = _probe(tmp_path, "1", _programs(100), ASD_JAX_COMPILATION_CACHE_MB="64")
  assert run.returncode == 0, run.stderr
  assert "persistent compilation cache" not in run.stderr, run.stderr
  entries = {e.name.removesuffix("-cache") for e in folder.glob("*-cache")}
  assert unfinished not in entries  # dropped: it may be cut short, and costs one compile
  # The first run's other seven kept, the second run's eight written, each with its time.
  assert len([e for e in entries if e.startswith("jit__lambda-")]) == 7 + 8
  assert entries == {e.name.removesuffix("-atime") for e in folder.glob("*-atime")}
