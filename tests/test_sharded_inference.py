"""Tensor-parallel inference on fake CPU devices gives the tokens of one device.

Runs in a subprocess: the 8-device XLA flag must be set before JAX starts, and it would slow
every other test in this process.
"""

import os
import subprocess
import sys
from pathlib import Path


def test_sharded_decoding_matches_single_device():
  root = Path(__file__).resolve().parent.parent
  env = {**os.environ, "PYTHONPATH": str(root)}
  proc = subprocess.run([sys.executable, str(root / "tests" / "sharded_inference_check.py")],
                        cwd=root, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert proc.stdout.count("same") == 6, proc.stdout
