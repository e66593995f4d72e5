"""On 8 fake CPU devices: --mesh=4x2 and --mesh=1x1 give the same loss curve (20 steps of the
tiny preset, baseline and VSD objectives), and a batch the data axis does not divide is refused.

Runs in a subprocess: the device-count flag must be set before JAX starts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = r"""
import os, sys
flags = os.environ.get("XLA_FLAGS", "")  # the test run's own are kept (tests/conftest.py)
os.environ["XLA_FLAGS"] = flags + " --xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"
import jax, numpy as np
from configs.train_presets import get_preset, with_overrides
from vsd_jax.build_dataset import build
from vsd_jax.sharding_rules import make_mesh
from vsd_jax.trainer import Trainer

assert len(jax.devices()) == 8
data, work, objective = sys.argv[1], sys.argv[2], sys.argv[3]
cfg = with_overrides(get_preset("tiny"), [f"data_dir={data}", "steps=20", "eval_every=0",
                                          "ckpt_every=100", "vsd_paths=6", "vsd_depth=4",
                                          "vsd_positions=2"])
build(cfg, log=lambda *_: None)
curves = {}
for mesh, n in (((4, 2), None), ((1, 1), 1)):
  tr = Trainer(cfg, make_mesh(*mesh, n), f"{work}/{mesh}", objective=objective,
               log=lambda *_: None, progress=False)
  if mesh == (4, 2):
    sharded = [x for x in jax.tree_util.tree_leaves(tr.frozen["target"])
               if not x.sharding.is_fully_replicated]
    assert sharded, "the target is not sharded over 'model'"
  curves[mesh] = np.array([c["loss"] for c in tr.run()["curve"]])
  tr.close()
a, b = curves[(4, 2)], curves[(1, 1)]
print("curve", a.tolist())
print("max diff", float(np.abs(a - b).max()))
assert len(a) == 20 and np.allclose(a, b, rtol=0, atol=1e-5), (a, b)
if objective == "baseline":  # VSD's L_WL grows with the drafter's acceptance; not monotone
  assert a[-1] < a[0]
try:
  Trainer(with_overrides(cfg, ["batch_size=6"]), make_mesh(4, 2), f"{work}/bad",
          log=lambda *_: None)
except ValueError as e:
  assert "batch_size=6 is not divisible by the mesh's data axis (4)" in str(e), e
  print("batch check ok")
try:
  make_mesh(1, 1)
except ValueError as e:
  assert "--num-devices=1" in str(e), e
  print("mesh check ok")
"""


@pytest.mark.parametrize("objective", ["baseline", "vsd"])
def test_mesh_4x2_matches_1x1(tmp_path, objective):
  root = Path(__file__).resolve().parent.parent
  env = {**os.environ, "PYTHONPATH": str(root)}
  proc = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path / "data"),
                         str(tmp_path / "work"), objective], cwd=root, env=env, capture_output=True,
                        text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
  assert "batch check ok" in proc.stdout and "mesh check ok" in proc.stdout, proc.stdout
  print(proc.stdout)  # the 4x2 curve and its largest difference from 1x1 (pytest -s)
