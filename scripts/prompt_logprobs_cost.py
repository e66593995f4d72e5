"""What `--prompt-logprobs` costs: scoring a prompt (asd_jax/prompt_logprobs.py) next to the
decode engine's own prefill and next to a whole answer.

  python scripts/prompt_logprobs_cost.py --json docs/bench/prompt_logprobs_cost_cpu.json

Prompts: the first `--prompts` MT-Bench questions through the chat template ("short"), and one
prompt of those questions joined until it holds `--long-tokens` tokens ("long"). For each, one
pass times, alternating so every call sees the same background load:
- prefill: plain_decode with max_new_tokens=1 (the engine's prefill and one sampled token),
- score: prompt_logprobs at each `--chunks` size (positions per forward), then with
  top_logprobs=5 at the default chunk,
- answer: plain_decode of `--max-new-tokens` tokens, EOS ignored (the decode generate runs).
The table gives milliseconds per call (median over `--passes`) and the ratios score / prefill
and score / answer: what asking `generate` for prompt logprobs adds to a request. Programs are
compiled before timing. The script fails if scoring at two chunk sizes disagrees by more than
1e-3 on any token (the chunks must not change the numbers).
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
from asd_jax.prompt_logprobs import CHUNK, prompt_logprobs  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer  # noqa: E402

TOP = 5


def long_prompt(tokenizer, questions: list[str], tokens: int) -> list[int]:
  """One chat prompt of the questions joined (cycled) until it holds at least `tokens` ids."""
  text, i = "", 0
  while True:
    text += questions[i % len(questions)] + "\n\n"
    ids = encode_chat(tokenizer, text)
    if len(ids) >= tokens:
      return ids
    i += 1


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--prompts", type=int, default=4, help="short MT-Bench prompts")
  p.add_argument("--long-tokens", type=int, default=1024)
  p.add_argument("--chunks", default=f"64,{CHUNK},512",
                 help="comma-separated chunk sizes to score at")
  p.add_argument("--passes", type=int, default=5)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  for name in ("prompts", "long_tokens", "passes", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
  try:
    chunks = [int(c) for c in args.chunks.split(",")]
  except ValueError:
    p.error(f"--chunks takes comma-separated integers, got {args.chunks!r}")
  if min(chunks) < 1 or CHUNK not in chunks:
    p.error(f"--chunks must be positive and include the default {CHUNK}, got {args.chunks}")

  tokenizer = load_tokenizer(args.target)
  loaded = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, args.target)
  fns, params = decoder_fns(loaded.model, name=args.target)
  questions = [q.text for q in load_prompts(("mt_bench",), args.prompts)]
  prompts = {f"short {i + 1}": encode_chat(tokenizer, q) for i, q in enumerate(questions)}
  prompts["long"] = long_prompt(tokenizer, questions, args.long_tokens)

  def calls(prompt, lengths):
    out = {"prefill": lambda: plain_decode(fns, params, prompt, lengths, max_new_tokens=1),
           "answer": lambda: plain_decode(fns, params, prompt, lengths, eos_ids=(),
                                          max_new_tokens=args.max_new_tokens)}
    for c in chunks:
      out[f"score chunk {c}"] = (lambda c=c: prompt_logprobs(fns, params, prompt, lengths,
                                                             chunk=c))
    out[f"score top {TOP}"] = lambda: prompt_logprobs(fns, params, prompt, lengths,
                                                      top_logprobs=TOP)
    return out

  results = []
  for name, ids in prompts.items():
    prompt, lengths = right_pad([ids])
    named = calls(prompt, lengths)
    scores = {c: np.asarray(jax.device_get(named[f"score chunk {c}"]()).logprobs_BxT)
              for c in chunks}  # compiles each program once, untimed
    for call in named.values():
      jax.block_until_ready(call())
    worst = max(float(np.abs(s - scores[CHUNK]).max()) for s in scores.values())
    if worst > 1e-3:
      raise SystemExit(f"{name}: scoring at chunks {chunks} differs by {worst:.2e}")
    times = {key: [] for key in named}
    for _ in range(args.passes):
      for key, call in named.items():
        t0 = time.perf_counter()
        jax.block_until_ready(call())
        times[key].append(time.perf_counter() - t0)
    ms = {key: round(1e3 * float(np.median(t)), 2) for key, t in times.items()}
    default = ms[f"score chunk {CHUNK}"]
    results.append({"prompt": name, "prompt_tokens": len(ids), "width": prompt.shape[1],
                    "ms": ms, "score_over_prefill": round(default / ms["prefill"], 3),
                    "score_over_answer": round(default / ms["answer"], 4),
                    "chunk_disagreement": worst})

  keys = list(results[0]["ms"])
  print(f"{'prompt':<10}{'tokens':>7}" + "".join(f"{k:>17}" for k in keys)
        + f"{'score/prefill':>15}{'score/answer':>14}")
  for r in results:
    print(f"{r['prompt']:<10}{r['prompt_tokens']:>7}"
          + "".join(f"{r['ms'][k]:>15.1f}ms" for k in keys)
          + f"{r['score_over_prefill']:>15.2f}{r['score_over_answer']:>14.3f}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"target": args.target, "backend": jax.default_backend(),
                 "cpu_count": os.cpu_count(), "passes": args.passes,
                 "max_new_tokens": args.max_new_tokens, "default_chunk": CHUNK,
                 "results": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
