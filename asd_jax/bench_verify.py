"""Micro-benchmark: the cost of ASD verification next to strict greedy verification.

  python -m asd_jax.bench_verify [--json FILE] [--forward-ms 26] [--batches 1,8,64]

Times one jitted block verification (K draft tokens, K+1 logits rows of V) per call, as it
runs inside a decode loop (traced inputs, no host checks), for `asd_verify` and
`greedy_verify`, and reports ASD's extra cost over greedy and both as a share of one target
forward over K+1 tokens. The forward time is an argument (default: SmolLM2-135M decode over 8
tokens on the 2-core reference CPU, about 26 ms at batch 1). "% fwd x B" assumes the forward
grows linearly with batch, as it does on a compute-bound CPU; "% fwd(B=1)" does not scale it.
Targets: ASD adds < 5% over greedy and costs < 1% of the forward.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.asd_config import PAPER
from asd_jax.asd_verify import asd_verify
from asd_jax.cli_common import check_output_path
from asd_jax.greedy_verify import greedy_verify


def _inputs(batch: int, k: int, vocab: int, dtype, seed: int = 0):
  rng = np.random.default_rng(seed)
  logits = rng.normal(size=(batch, k + 1, vocab)).astype(np.float32)
  best = logits.argmax(-1)[:, :k]
  # Half the draft agrees with the target, so prefixes and charges vary across rows.
  draft = np.where(rng.random((batch, k)) < 0.5, best, rng.integers(0, vocab, (batch, k)))
  return (jnp.asarray(draft, jnp.int32), jnp.asarray(logits, dtype),
          jnp.zeros((batch,), jnp.float32))


def _median_ms(fns, args, reps: int):
  """Median wall time per call of each fn, calls interleaved so load drifts hit all alike."""
  times = [[] for _ in fns]
  for fn in fns:
    jax.block_until_ready(fn(*args))
  for _ in range(reps):
    for i, fn in enumerate(fns):
      start = time.perf_counter()
      jax.block_until_ready(fn(*args))
      times[i].append(time.perf_counter() - start)
  return [1e3 * statistics.median(t) for t in times]


def run(batches, k: int, vocab: int, dtype, forward_ms: float, budget_s: float):
  greedy = jax.jit(lambda d, z, s: greedy_verify(d, z, s))
  asd = jax.jit(lambda d, z, s: asd_verify(d, z, s, PAPER))
  rows = []
  for batch in batches:
    args = _inputs(batch, k, vocab, dtype)
    probe_ms = _median_ms([greedy], args, 3)[0]
    reps = int(min(400, max(20, budget_s * 1e3 / (2 * probe_ms))))
    greedy_ms, asd_ms = _median_ms([greedy, asd], args, reps)
    rows.append(dict(
        batch=batch, reps=reps, greedy_ms=greedy_ms, asd_ms=asd_ms,
        asd_over_greedy_pct=100 * (asd_ms / greedy_ms - 1),
        asd_pct_of_forward_b1=100 * asd_ms / forward_ms,
        asd_pct_of_forward_scaled=100 * asd_ms / (forward_ms * batch),
    ))
  return rows


def format_table(rows, forward_ms: float) -> str:
  head = (f"{'batch':>5} {'greedy ms':>10} {'asd ms':>9} {'asd-greedy':>11} "
          f"{'% fwd(B=1)':>11} {'% fwd x B':>10}")
  lines = [f"forward over K+1 tokens at batch 1: {forward_ms:.1f} ms", head, "-" * len(head)]
  for r in rows:
    lines.append(f"{r['batch']:>5} {r['greedy_ms']:>10.3f} {r['asd_ms']:>9.3f} "
                 f"{r['asd_over_greedy_pct']:>+10.1f}% {r['asd_pct_of_forward_b1']:>10.2f}% "
                 f"{r['asd_pct_of_forward_scaled']:>9.2f}%")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m asd_jax.bench_verify",
                                   description=__doc__.split("\n\n")[0])
  parser.add_argument("--k", type=int, default=7, help="draft block length K")
  parser.add_argument("--vocab", type=int, default=49_152, help="vocabulary size V")
  parser.add_argument("--batches", default="1,8,64", help="comma-separated batch sizes")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--forward-ms", type=float, default=26.0,
                      help="one target forward over K+1 tokens at batch 1, in ms")
  parser.add_argument("--seconds", type=float, default=4.0,
                      help="rough timing budget per batch size")
  parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
  args = parser.parse_args(argv)
  if args.k < 1 or args.vocab < 1 or args.forward_ms <= 0 or args.seconds <= 0:
    parser.error("--k and --vocab must be >= 1, --forward-ms and --seconds > 0")
  try:
    batches = [int(b) for b in args.batches.split(",")]
  except ValueError:
    parser.error(f"--batches must be comma-separated ints, got {args.batches!r}")
  if min(batches) < 1:
    parser.error(f"--batches must be positive, got {args.batches!r}")
  if args.json:
    try:  # refused now, not after the timing
      check_output_path(args.json, "--json")
    except ValueError as e:
      parser.error(str(e))

  rows = run(batches, args.k, args.vocab, jnp.dtype(args.dtype), args.forward_ms, args.seconds)
  device = jax.devices()[0]
  print(f"verify K={args.k} V={args.vocab} {args.dtype} on {device.platform} "
        f"({device.device_kind}); config {PAPER}")
  print(format_table(rows, args.forward_ms))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(k=args.k, vocab=args.vocab, dtype=args.dtype, forward_ms=args.forward_ms,
                     platform=device.platform, device_kind=device.device_kind,
                     config=dict(budget=PAPER.budget, gate=PAPER.gate,
                                 max_exceptions=PAPER.max_exceptions),
                     targets=dict(asd_over_greedy_pct=5.0, asd_pct_of_forward=1.0),
                     rows=rows), f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
