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
  env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
  return subprocess.Popen([sys.executable, "-m", "vsd_jax.train", *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finalized_checkpoint(workdir) -> bool:
  ckpt = Path(workdir) / "checkpoints"
  return ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())


def _run_until(args, step: int, sig, workdir=None) -> tuple[str, int]:
  """Starts a run and sends `sig` at the first logged step >= `step` (and, with `workdir`, once
  an async checkpoint there has been finalized, so the kill has something to resume from);
  returns its output and the step it was signalled at (0: it finished first)."""
  proc, seen, at = _start(args), [], 0
  for line in proc.stdout:
    seen.append(line)
    msg = line.split("] ", 1)[-1]
    if msg.startswith("step ") and int(msg.split()[1].rstrip(":")) >= step and (
        workdir is None or _finalized_checkpoint(workdir)):
      at = int(msg.split()[1].rstrip(":"))
      proc.send_signal(sig)
      break
  out, _ = proc.communicate(timeout=300)
  return "".join(seen) + out, at


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
  out, killed_at = _run_until(args, kill_at, signal.SIGKILL, workdir=work)
  assert 0 < killed_at < N, out[-3000:]
  term_at = random.randint(min(max(N // 2 + 1, killed_at + 1), N - 1), N - 1)
  out, _ = _run_until(args, term_at, signal.SIGTERM)
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
                                  err_msg=f"killed at {killed_at}, SIGTERM at {term_at}")
  assert position.to_json() == {"epoch": 1, "index": (N - 12) * 8}  # 96 examples / batch 8
