"""What per-row sampling buys: requests that sample differently, decoded in one batch
(`sampling=[one SamplingConfig per row]`) instead of one call per setting.

  python scripts/row_sampling_batch.py --json docs/bench/row_sampling_batch_cpu.json

The first `--prompts` MT-Bench prompts, each with its own settings (temperatures 0.6-1.2, and
in turn top-k 40, top-p 0.9, min-p 0.05, a repetition penalty 1.1, or none), `--max-new-tokens`
each, EOS ignored so every run does the same work. Three ways, alternating pass by pass:
- one call per row: what a caller without per-row settings must do (and generate did),
- one batch, per-row settings: the rows' own settings in one call,
- one batch, one setting: the first row's settings for all (what a batch costs when the
  rows agree: the price of the per-row filters is the gap to this row).
The table gives tokens per second (medians over `--passes`) and the ratios; the script fails if
a row's tokens in the per-row batch differ from the same row decoded alone (same seed).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402
import numpy as np  # noqa: E402

from asd_jax.bench_prompts import load_prompts  # noqa: E402
from asd_jax.cli_common import right_pad  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.sampling import SamplingConfig  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer  # noqa: E402

FILTERS = ({"top_k": 40}, {"top_p": 0.9}, {"min_p": 0.05}, {"repetition_penalty": 1.1}, {})


def row_settings(n: int) -> list[SamplingConfig]:
  """n different requests: temperatures spread over [0.6, 1.2], one extra setting each."""
  return [SamplingConfig(temperature=round(0.6 + 0.6 * i / max(n - 1, 1), 3),
                         **FILTERS[i % len(FILTERS)]) for i in range(n)]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--prompts", type=int, default=8, help="MT-Bench prompts (= rows)")
  p.add_argument("--passes", type=int, default=3)
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  for name in ("prompts", "passes", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")

  tokenizer = load_tokenizer(args.target)
  loaded = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, args.target)
  fns, params = decoder_fns(loaded.model, name=args.target)
  rows = [encode_chat(tokenizer, q.text) for q in load_prompts(("mt_bench",), args.prompts)]
  settings = row_settings(len(rows))
  seeds = np.arange(len(rows))
  prompt, lengths = right_pad(rows)

  def decode(b_rows, sampling):
    out = plain_decode(fns, params, prompt[b_rows], lengths[b_rows], eos_ids=(),
                       max_new_tokens=args.max_new_tokens, sampling=sampling,
                       seed=seeds[b_rows])
    return np.asarray(jax.device_get(out.tokens_BxN))

  every = np.arange(len(rows))
  ways = {
      "one call per row": lambda: [decode(every[b:b + 1], settings[b]) for b in every],
      "one batch, per-row settings": lambda: decode(every, settings),
      "one batch, one setting": lambda: decode(every, settings[0]),
  }
  alone = np.concatenate(ways["one call per row"]())  # compiles, untimed
  together = ways["one batch, per-row settings"]()
  ways["one batch, one setting"]()
  if not np.array_equal(alone, together):
    raise SystemExit("a row of the per-row batch differs from the row decoded alone")
  times = {name: [] for name in ways}
  for _ in range(args.passes):
    for name, way in ways.items():
      t0 = time.perf_counter()
      way()
      times[name].append(time.perf_counter() - t0)
  tokens = len(rows) * args.max_new_tokens
  per_row = tokens / float(np.median(times["one call per row"]))
  results = []
  print(f"{'way':<30}{'tok/s':>10}{'vs one call per row':>22}")
  for name, t in times.items():
    rate = tokens / float(np.median(t))
    results.append({"way": name, "tokens_per_s": round(rate, 2),
                    "ratio_to_one_call_per_row": round(rate / per_row, 3),
                    "wall_s": [round(x, 3) for x in t]})
    print(f"{name:<30}{rate:>10.1f}{rate / per_row:>21.2f}x")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"target": args.target, "backend": jax.default_backend(),
                 "cpu_count": os.cpu_count(), "rows": len(rows), "passes": args.passes,
                 "max_new_tokens": args.max_new_tokens,
                 "settings": [str(s) for s in settings], "results": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
