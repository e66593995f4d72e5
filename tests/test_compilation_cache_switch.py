"""ASD_JAX_COMPILATION_CACHE: the CLIs' persistent compilation cache goes where
ASD_JAX_CACHE_DIR says, stays off at 0, and a bad value is a clear error. Each case runs in a
fresh interpreter, because the jax setting it changes is process-wide."""

import os
import subprocess
import sys

import pytest

PROBE = ("import jax; from asd_jax.cli_common import enable_compilation_cache; "
         "enable_compilation_cache(); print(jax.config.jax_compilation_cache_dir)")


def _probe(tmp_path, switch):
  env = dict(os.environ, ASD_JAX_CACHE_DIR=str(tmp_path), ASD_JAX_COMPILATION_CACHE=switch)
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # tests/conftest.py's own folder for the suite
  return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
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
