"""Exact resume: kill -9 at a random step, SIGTERM at another, resume; the parameters after N
total steps are bitwise identical to an uninterrupted N-step run (CPU, one device)."""

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np

from configs.train_presets import get_preset, with_overrides

ROOT = Path(__file__).resolve().parent.parent
N = 14


def _start(args):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.update(PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
  return subprocess.Popen([sys.executable, "-m", "vsd_jax.train", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _run_until(args, step: int, sig) -> str:
  """Starts a run and sends `sig` once it has logged `step`; returns its output."""
  proc, seen = _start(args), []
  for line in proc.stdout:
    seen.append(line)
    if line.split("] ", 1)[-1].startswith(f"step {step}:"):
      proc.send_signal(sig)
      break
  out, _ = proc.communicate(timeout=300)
  return "".join(seen) + out


def test_kill_and_resume_is_bitwise_exact(tmp_path):
  from vsd_jax.build_dataset import build
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer

  data = tmp_path / "data"
  sets = [f"data_dir={data}", "eval_every=0", "ckpt_every=2", "log_every=1"]
  cfg = with_overrides(get_preset("tiny"), sets)
  build(cfg, log=lambda *_: None)
  ref = Trainer(cfg, make_mesh(1, 1), str(tmp_path / "ref"), log=lambda *_: None,
                progress=False)
  ref.run(N)
  ref.close()

  work = str(tmp_path / "killed")
  args = ["--config=tiny", f"--workdir={work}", f"--steps={N}", "--no-progress"]
  for s in sets:
    args += ["--set", s]
  kill_at = random.randint(3, N // 2)
  out = _run_until(args, kill_at, signal.SIGKILL)
  assert f"step {kill_at}:" in out, out[-3000:]
  term_at = random.randint(N // 2 + 1, N - 2)
  out = _run_until(args, term_at, signal.SIGTERM)
  assert "resumed from" in out and "SIGTERM" in out, out[-3000:]
  proc = _start(args)
  out, _ = proc.communicate(timeout=300)
  assert proc.returncode == 0 and "resumed from" in out, out[-3000:]

  resumed = Trainer(cfg, make_mesh(1, 1), work, log=lambda *_: None, progress=False)
  state, position = resumed.restore_or_init()
  resumed.close()
  assert int(state.step) == N
  a, b = jax.tree_util.tree_leaves(ref.state), jax.tree_util.tree_leaves(state)
  assert len(a) == len(b)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                  err_msg=f"killed at {kill_at}, SIGTERM at {term_at}")
  assert position.to_json() == {"epoch": 1, "index": (N - 12) * 8}  # 96 examples / batch 8
