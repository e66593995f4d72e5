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
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from asd_jax.cli_common import check_positive_flags, time_interleaved  # noqa: E402
from scripts.decode_loop_timing import loop_runs  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--k", type=int, default=5)
  p.add_argument("--new-tokens", type=int, default=96)
  p.add_argument("--passes", type=int, default=5)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  try:
    check_positive_flags(args, "k", "new_tokens", "passes")
  except ValueError as e:
    p.error(str(e))
  n = args.new_tokens
  runs = {}
  for label, blocks in (("float32", False), ("blocks", True)):
    fns, params = decoder_fns(load_decoder(args.target, weight_blocks=blocks).model)
    loop = loop_runs(fns, params, (args.k,), new_tokens=n)
    runs[f"{label} plain step"] = loop[0]
    runs[f"{label} K={args.k} round"] = loop[args.k]
  outputs, seconds = time_interleaved(runs, args.passes)
  reference = outputs["float32 plain step"]
  if not all((out == reference).all() for out in outputs.values()):
    print("outputs differ between configurations")
    return 1
  ms = {name: value / n * 1e3 for name, value in seconds.items()}
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
