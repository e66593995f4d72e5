"""The native few-rows matmul against XLA's dot, in the same run, on SmolLM2-135M's shapes.

  python scripts/bench_few_rows_matmul.py --json out/few_rows_matmul.json

Two workloads, each jitted whole so the weights stream from memory as in a decode step:
- `mlp`: 30 blocks of SmolLM2's MLP (gate and up 576x1536, down 1536x576; 318 MB float32);
- `head`: the tied LM head, logits = h @ E^T with E [49152, 576] (113 MB).
Rows = tokens in the forward: 1 for a decode step, K + 1 for a chain verification.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models import few_rows_matmul as frm  # noqa: E402


def _median_ms(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3


def _mlp(dot):
  def run(x_MxD, blocks):
    for gate, up, down in blocks:
      x_MxD = x_MxD + dot(jax.nn.silu(dot(x_MxD, gate, 0)) * dot(x_MxD, up, 0), down, 0)
    return x_MxD
  return jax.jit(run)


def _head(dot):
  return jax.jit(lambda h_MxD, embed_VxD: dot(h_MxD, embed_VxD, 1))


def _native(x, w, contract):
  return frm.few_rows_matmul(x, w, transposed=contract == 1)


def _xla(x, w, contract):
  return jax.lax.dot_general(x, w, (((1,), (contract,)), ((), ())))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", default="1,2,4,6,8,12,16")
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if not frm.native_available():
    print("the native kernel is unavailable on this machine (see the warning above)")
    return 1
  rng = np.random.default_rng(0)
  normal = lambda *shape: jnp.asarray(rng.standard_normal(shape, np.float32) * 0.02)
  blocks = [(normal(576, 1536), normal(576, 1536), normal(1536, 576)) for _ in range(30)]
  embed = normal(49152, 576)
  workloads = {"mlp": (_mlp(_native), _mlp(_xla), blocks),
               "head": (_head(_native), _head(_xla), embed)}
  rows_out = []
  print(f"{'workload':8} {'rows':>4} {'native ms':>10} {'xla ms':>8} {'xla / native':>13}")
  for name, (native_fn, xla_fn, weights) in workloads.items():
    for m in [int(r) for r in args.rows.split(",")]:
      x = normal(m, 576) * 50
      np.testing.assert_allclose(np.asarray(native_fn(x, weights)), np.asarray(xla_fn(x, weights)),
                                 rtol=1e-3, atol=1e-3)
      native_ms = _median_ms(native_fn, x, weights, repeats=args.repeats)
      xla_ms = _median_ms(xla_fn, x, weights, repeats=args.repeats)
      rows_out.append({"workload": name, "rows": m, "native_ms": native_ms, "xla_ms": xla_ms})
      print(f"{name:8} {m:4d} {native_ms:10.2f} {xla_ms:8.2f} {xla_ms / native_ms:12.2f}x",
            flush=True)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"machine": os.uname().machine, "cpus": os.cpu_count(),
                 "load_average": os.getloadavg(), "max_rows": frm.MAX_ROWS, "rows": rows_out},
                f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
