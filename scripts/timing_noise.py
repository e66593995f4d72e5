"""Is this machine quiet enough for the paper's 3% drift rule? Back-to-back timing noise.

  python scripts/timing_noise.py --json out/timing_noise.json

Runs our plain greedy decoding on the first MT-Bench prompt `--calls` times back to back (256
new tokens, EOS ignored, the suite's per-prompt workload) and prints each call's seconds, their
coefficient of variation, and what that noise alone does to the strict -> ASD -> strict
protocol over `--prompts` prompts: the drift's sd and the share of triples the 3% rule flags
with no drift at all (asd_jax.bench_protocol.chance_drift, which assumes independent noise
per call). Run it with nothing else on the machine; a busy neighbour is what it measures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from asd_jax.bench_prompts import load_prompts  # noqa: E402
from asd_jax.bench_protocol import DRIFT_TOL, chance_drift, timed_pass  # noqa: E402
from asd_jax.bench_rows import BenchContext, make_batches, ours_plain_greedy  # noqa: E402
from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--calls", type=int, default=12)
  p.add_argument("--max-new-tokens", type=int, default=256)
  p.add_argument("--prompts", default="20,40,80",
                 help="pass sizes (prompts per protocol pass) to report the drift for")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if args.calls < 2:
    p.error(f"--calls must be at least 2 to measure a spread, got {args.calls}")
  if args.max_new_tokens < 1:
    p.error(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
  try:
    sizes = [int(n) for n in args.prompts.split(",")]
  except ValueError:
    sizes = []
  if not sizes or any(n < 1 for n in sizes):
    p.error(f"--prompts must be positive integers separated by commas, got {args.prompts!r}")

  tokenizer = load_tokenizer(args.target)
  prompt = load_prompts(("mt_bench",), 1)[0]
  ids = encode_chat(tokenizer, prompt.text)
  # The same prompt `--calls` times: one protocol pass over identical batches, back to back.
  ctx = BenchContext(target=args.target, tokenizer=tokenizer,
                     batches=make_batches([(prompt.suite, ids)] * args.calls, 1),
                     max_new_tokens=args.max_new_tokens, eos_ids=(), batch_size=1, repeats=1)
  check_tokenizer_fits(tokenizer, ctx.jax_target[2].cfg.vocab_size, args.target)
  row = ours_plain_greedy(ctx)
  row.warmup(ctx.batches)
  seconds = timed_pass(ctx, row)["batch_wall_s"]

  mean = statistics.mean(seconds)
  cv = statistics.stdev(seconds) / mean
  print("seconds per call: " + " ".join(f"{s:.3f}" for s in seconds))
  print(f"mean {mean:.3f} s, cv {cv:.1%}, slowest / fastest {max(seconds) / min(seconds):.3f}")
  print(f"{'prompts per pass':>16} {'drift sd':>9} {'flagged by ' + f'{DRIFT_TOL:.0%}':>14}")
  drift = {}
  for n in sizes:
    drift[n] = chance_drift(cv, n)
    print(f"{n:16d} {drift[n]['drift_sd']:9.1%} {drift[n]['flagged_share']:14.0%}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"cpus": os.cpu_count(), "load_average": os.getloadavg(),
                 "target": args.target, "prompt_id": prompt.prompt_id,
                 "prompt_tokens": len(ids), "max_new_tokens": args.max_new_tokens,
                 "seconds": seconds, "cv": round(cv, 4),
                 "drift_by_prompts": drift}, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
