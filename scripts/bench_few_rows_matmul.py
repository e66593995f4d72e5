"""The native few-rows matmul against XLA's dot, in the same run, on SmolLM2-135M's shapes.

  python scripts/bench_few_rows_matmul.py --json out/few_rows_matmul.json

Two workloads, each jitted whole so the weights stream from memory as in a decode step:
- `mlp`: 30 blocks of SmolLM2's MLP (gate and up 576x1536, down 1536x576; 318 MB float32,
  50 MB as the GGUF's Q4_1 blocks);
- `head`: the tied LM head, logits = h @ E^T with E [49152, 576] (113 MB; 30 MB as Q8_0).
Rows = tokens in the forward: 1 for a decode step, K + 1 for a chain verification. Three
columns, one set of weights (random, quantised like the GGUF, dequantised for float32): XLA's
dot, the native kernel on float32, the native kernel on the blocks (bitwise equal to the
float32 kernel's result, checked; above `MAX_ROWS` rows it is XLA's dot).
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
import gguf  # noqa: E402

from models import block_quant as bq  # noqa: E402
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
  return jax.jit(lambda h_MxD, embed: dot(h_MxD, embed, 1))


# Weights are (float32 array, its blocks) pairs.
def _native(x, w, contract):
  return frm.few_rows_matmul(x, w[0], transposed=contract == 1)


def _native_blocks(x, w, contract):
  return frm.few_rows_matmul(x, w[0], transposed=contract == 1, blocks=w[1])


def _xla(x, w, contract):
  return jax.lax.dot_general(x, w[0], (((1,), (contract,)), ((), ())))


def _quantised(rng, n, k, qtype, transposed):
  """A random [n, k] weight stored as the GGUF would: (float32 in the kernel's orientation,
  its packed blocks)."""
  raw = gguf.quants.quantize(rng.standard_normal((n, k), np.float32) * 0.02, qtype)
  w_NxK = gguf.quants.dequantize(raw, qtype).astype(np.float32)
  if transposed:
    return jnp.asarray(w_NxK), jax.tree_util.tree_map(jnp.asarray, bq.pack_q8_0(raw, k))
  return (jnp.asarray(np.ascontiguousarray(w_NxK.T)),
          jax.tree_util.tree_map(jnp.asarray, bq.pack_q4_1(raw, k)))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--rows", default="1,2,4,6,8,12,16")
  p.add_argument("--repeats", type=int, default=15)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if args.repeats <= 0:
    p.error(f"--repeats must be positive, got {args.repeats}")
  if not frm.native_available():
    print("the native kernel is unavailable on this machine (see the warning above)")
    return 1
  rng = np.random.default_rng(0)
  Q = gguf.GGMLQuantizationType
  blocks = [(_quantised(rng, 1536, 576, Q.Q4_1, False), _quantised(rng, 1536, 576, Q.Q4_1, False),
             _quantised(rng, 576, 1536, Q.Q4_1, False)) for _ in range(30)]
  embed = _quantised(rng, 49152, 576, Q.Q8_0, True)
  workloads = {"mlp": (_mlp(_xla), _mlp(_native), _mlp(_native_blocks), blocks),
               "head": (_head(_xla), _head(_native), _head(_native_blocks), embed)}
  rows_out = []
  print(f"{'workload':8} {'rows':>4} {'xla ms':>8} {'native ms':>10} {'blocks ms':>10} "
        f"{'xla / native':>13} {'xla / blocks':>13}")
  for name, (xla_fn, native_fn, blocks_fn, weights) in workloads.items():
    for m in [int(r) for r in args.rows.split(",")]:
      x = jnp.asarray(rng.standard_normal((m, 576), np.float32))
      native_out = np.asarray(native_fn(x, weights))
      np.testing.assert_allclose(native_out, np.asarray(xla_fn(x, weights)), rtol=1e-3, atol=1e-3)
      if m <= frm.MAX_ROWS:  # past it the float32 side is XLA's dot
        np.testing.assert_array_equal(np.asarray(blocks_fn(x, weights)), native_out)
      xla_ms = _median_ms(xla_fn, x, weights, repeats=args.repeats)
      native_ms = _median_ms(native_fn, x, weights, repeats=args.repeats)
      blocks_ms = _median_ms(blocks_fn, x, weights, repeats=args.repeats)
      rows_out.append({"workload": name, "rows": m, "xla_ms": xla_ms, "native_ms": native_ms,
                       "blocks_ms": blocks_ms})
      print(f"{name:8} {m:4d} {xla_ms:8.2f} {native_ms:10.2f} {blocks_ms:10.2f} "
            f"{xla_ms / native_ms:12.2f}x {xla_ms / blocks_ms:12.2f}x", flush=True)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"machine": os.uname().machine, "cpus": os.cpu_count(),
                 "load_average": os.getloadavg(), "max_rows": frm.MAX_ROWS, "rows": rows_out},
                f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
