"""ms per plain decode step and per K-token verification round, with and without weight blocks.

  python scripts/time_decode_loop.py --json out/decode_loop.json

One 180-token prompt (random ids), capacity 448, 96 new tokens, batch 1. The round uses a
drafter that always proposes token 0, so each round commits one token and its time is the
verification of K + 1 tokens plus the loop's bookkeeping (no drafting cost). Every
configuration runs `--passes` times, interleaved, and the median is reported; all outputs
must equal the float32 plain decoding's (the blocks are the same weights).
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
from asd_jax.drafter_api import ChainDrafter  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.spec_decode import asd_decode  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402


def zeros_drafter(k: int, vocab_size: int) -> ChainDrafter:
  def propose(params, state, recent_Bx2, positions_Bx2, key, sampling):
    return jnp.zeros((recent_Bx2.shape[0], k), jnp.int32), None, state
  return ChainDrafter(prefill=lambda *a: jnp.zeros((), jnp.int32), propose=propose, num_draft=k,
                      vocab_size=vocab_size, name=f"zeros{k}")


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--k", type=int, default=5)
  p.add_argument("--new-tokens", type=int, default=96)
  p.add_argument("--passes", type=int, default=5)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  rng = np.random.RandomState(0)
  prompt = np.zeros((1, 192), np.int32)
  prompt[0, :180] = rng.randint(100, 5000, 180)
  lengths = np.array([180], np.int32)
  n, capacity = args.new_tokens, 448
  runs = {}
  for label, blocks in (("float32", False), ("blocks", True)):
    fns, params = decoder_fns(load_decoder(args.target, weight_blocks=blocks).model)
    drafter = zeros_drafter(args.k, fns.vocab_size)
    runs[f"{label} plain step"] = (
        lambda fns=fns, params=params: plain_decode(
            fns, params, prompt, lengths, max_new_tokens=n, capacity=capacity).tokens_BxN)
    runs[f"{label} K={args.k} round"] = (
        lambda fns=fns, params=params, drafter=drafter: asd_decode(
            fns, params, drafter, None, prompt, lengths, max_new_tokens=n,
            capacity=capacity).tokens_BxN)
  outputs = {name: np.asarray(run()) for name, run in runs.items()}  # also compiles
  reference = outputs["float32 plain step"]
  if not all((out == reference).all() for out in outputs.values()):
    print("outputs differ between configurations")
    return 1
  times = {name: [] for name in runs}
  for _ in range(args.passes):
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      times[name].append((time.perf_counter() - start) / n * 1e3)
  ms = {name: statistics.median(t) for name, t in times.items()}
  print(f"{'configuration':24} {'ms per token':>12} {'vs float32 plain':>17}")
  for name, value in ms.items():
    print(f"{name:24} {value:12.2f} {value / ms['float32 plain step']:16.2f}x")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"cpus": os.cpu_count(), "load_average": os.getloadavg(), "k": args.k,
                 "new_tokens": n, "passes": args.passes, "ms_per_token": ms,
                 "outputs_equal": True}, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
