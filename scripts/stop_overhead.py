"""What stop strings cost when none is met: the host search after every step or round.

  python scripts/stop_overhead.py --json out/stop_overhead.json

For plain greedy decoding and for a speculative chain (`--draft`, strict), each MT-Bench prompt
is decoded with and without a stop string that the answer never holds (`--stop`), EOS ignored,
`--max-new-tokens` each. The two runs of an engine alternate prompt by prompt (`--passes`
times over the prompts), so both see the same background load; the table gives tokens per
second, the ratio, and the added milliseconds per decode step (plain: per token; speculative:
per verification round). The script fails if a run with the stop string returns other tokens
than the run without, or if the stop string was met (then it measures nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402

from asd_jax.bench_prompts import load_prompts  # noqa: E402
from asd_jax.cli_common import right_pad  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.stop_strings import StopStrings  # noqa: E402
from models.drafter_setup import default_k, setup_drafter  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer  # noqa: E402


def engine_calls(args, loaded):
  """{engine name: call(prompt, lengths, stop) -> (tokens, steps)}."""
  fns, params = decoder_fns(loaded.model, name=args.target)

  def plain(prompt, lengths, stop):
    out = jax.device_get(plain_decode(fns, params, prompt, lengths,
                                      max_new_tokens=args.max_new_tokens, eos_ids=(), stop=stop))
    tokens = out.tokens_BxN[0, :out.num_generated_B[0]].tolist()
    return tokens, len(tokens)

  k = args.k or default_k(args.draft, jax.default_backend())
  setup = setup_drafter(args.draft, loaded, k=k, tree=None, target_name=args.target)

  def speculative(prompt, lengths, stop):
    out = jax.device_get(setup.decode(setup.target_fns, setup.target_params, setup.drafter,
                                      setup.params, prompt, lengths,
                                      max_new_tokens=args.max_new_tokens, rule="strict",
                                      eos_ids=(), stop=stop))
    return out.tokens_BxN[0, :out.num_generated_B[0]].tolist(), int(out.stats.rounds_B[0])

  return {"plain": plain, f"{args.draft} K={k} strict": speculative}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--draft", default="ngram+store")
  p.add_argument("--k", type=int, default=0, help="draft length (default: the drafter's own)")
  p.add_argument("--prompts", type=int, default=4, help="MT-Bench prompts")
  p.add_argument("--passes", type=int, default=5)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--stop", default="<<never-met stop string>>")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  for name in ("prompts", "passes", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
  if args.k < 0:
    p.error(f"--k must be positive, got {args.k}")

  tokenizer = load_tokenizer(args.target)
  loaded = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, args.target)
  stop = StopStrings.from_tokenizer(tokenizer, (args.stop,))
  rows = [right_pad([encode_chat(tokenizer, q.text)])
          for q in load_prompts(("mt_bench",), args.prompts)]
  calls = engine_calls(args, loaded)

  walls = {(e, s): 0.0 for e in calls for s in (False, True)}
  tokens = dict.fromkeys(walls, 0)
  steps = dict.fromkeys(walls, 0)
  for name, call in calls.items():       # compile both programs of each prompt width, untimed
    for prompt, lengths in rows:
      for with_stop in (False, True):
        call(prompt, lengths, stop if with_stop else None)
  for _ in range(args.passes):
    for prompt, lengths in rows:
      for name, call in calls.items():
        answers = {}
        for with_stop in (False, True):
          t0 = time.perf_counter()
          answers[with_stop], n_steps = call(prompt, lengths, stop if with_stop else None)
          walls[name, with_stop] += time.perf_counter() - t0
          tokens[name, with_stop] += len(answers[with_stop])
          steps[name, with_stop] += n_steps
        if answers[True] != answers[False]:
          raise SystemExit(f"{name}: the run with a stop string returned other tokens")
        if stop.find(tokenizer.decode(answers[True], skip_special_tokens=True)) is not None:
          raise SystemExit(f"{name}: the answer holds the stop string {args.stop!r}; pick one "
                           "that is never met")

  results = []
  print(f"{'engine':<28}{'tok/s':>10}{'with stop':>11}{'ratio':>8}{'ms/step added':>15}")
  for name in calls:
    base, with_stop = (tokens[name, s] / walls[name, s] for s in (False, True))
    added_ms = 1e3 * (walls[name, True] - walls[name, False]) / steps[name, True]
    results.append({"engine": name, "tokens_per_s": round(base, 2),
                    "tokens_per_s_with_stop": round(with_stop, 2),
                    "ratio": round(with_stop / base, 4), "ms_added_per_step": round(added_ms, 3),
                    "steps": steps[name, True], "new_tokens": tokens[name, True],
                    "wall_s": round(walls[name, False], 3),
                    "wall_s_with_stop": round(walls[name, True], 3)})
    print(f"{name:<28}{base:>10.1f}{with_stop:>11.1f}{with_stop / base:>8.3f}{added_ms:>15.3f}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"target": args.target, "backend": jax.default_backend(),
                 "prompts": args.prompts, "passes": args.passes,
                 "max_new_tokens": args.max_new_tokens, "stop": args.stop,
                 "cpu_count": os.cpu_count(), "results": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
