"""What a repetition penalty costs speculative decoding in acceptance, with the chain drafter
drafting under the penalty and without:

  python scripts/penalty_tau.py --repetition-penalties 1.0,1.2 --num-prompts 10 \
      --max-new-tokens 128 --json out/penalty_tau.json

For each penalty: plain greedy decoding of the prompts (the first N of each suite, one padded
batch, EOS honoured), then strict chain decoding of each prompt alone with the drafter as
shipped (a language-model drafter drafts under the penalty, ChainDrafter.takes_logit_edits) and
with that switched off. Prints tau (tokens per round) and how many answers equal plain
decoding's (all of them, under strict, is the promise), and writes them as JSON. tau is
DecodeStats' (the tokens verification rounds output / rounds), as generate reports it. Plain
decoding's batch is timed too, EOS ignored so every setting makes the same tokens: the
settings interleaved, --timing-repeats times each after a compiling call, the median kept, so
the penalties' own cost shows beside the first setting's (ratios within this run; the machine
is shared).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time

import numpy as np

from asd_jax.cli_common import check_output_path, check_positive_flags, run_cli


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--draft", default="smollm2-135m-standalone")
  p.add_argument("--k", type=int, default=2)
  p.add_argument("--suite", default="mt_bench,humaneval")
  p.add_argument("--num-prompts", type=int, default=10, help="per suite")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--repetition-penalties", default="1.0,1.2")
  p.add_argument("--timing-repeats", type=int, default=5)
  p.add_argument("--json", default="")
  return p


def check_args(args):
  """(suites, penalties as SamplingConfigs): every flag checked before the target loads."""
  from asd_jax.bench_prompts import parse_suites
  from asd_jax.cli_common import split_list_flag
  from asd_jax.sampling import SamplingConfig
  from models.drafter_setup import check_drafter_request
  check_positive_flags(args, "k", "num_prompts", "max_new_tokens", "timing_repeats")
  samplings = []
  for text in split_list_flag(args.repetition_penalties, "--repetition-penalties"):
    try:
      samplings.append(SamplingConfig(repetition_penalty=float(text)))
    except ValueError as e:
      raise ValueError(f"--repetition-penalties: {text!r}: {e}") from None
  check_drafter_request(args.draft, None, None)
  if args.json:
    check_output_path(args.json, "--json")
  return parse_suites(args.suite), samplings


@run_cli
def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  suites, samplings = check_args(args)
  from asd_jax.bench_prompts import load_prompts
  from asd_jax.cli_common import right_pad
  from asd_jax.plain_decode import plain_decode
  from models.drafter_setup import setup_drafter
  from models.load import load_decoder
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  tokenizer = load_tokenizer(args.target)
  prompts = load_prompts(suites, args.num_prompts)
  rows = [encode_chat(tokenizer, p.text) for p in prompts]
  target = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, target.cfg.vocab_size, args.target)
  eos = eos_token_ids(tokenizer, target.hf_config)
  setup = setup_drafter(args.draft, target, k=args.k, target_name=args.target)
  if not getattr(setup.drafter, "takes_logit_edits", False):
    raise ValueError(f"--draft {args.draft} does not draft under penalties (only language-model "
                     "chain drafters do); there is nothing to compare")
  drafters = {"under the penalty": setup.drafter,
              "without it": dataclasses.replace(setup.drafter, takes_logit_edits=False)}
  prompt, lengths = right_pad(rows, bucket=64)

  def plain_batch(sampling, eos_ids):
    out = plain_decode(setup.target_fns, setup.target_params, prompt, lengths,
                       max_new_tokens=args.max_new_tokens, eos_ids=eos_ids, sampling=sampling)
    out.tokens_BxN.block_until_ready()
    return out

  for sampling in samplings:
    plain_batch(sampling, ())  # compiles
  seconds = [[] for _ in samplings]
  for _ in range(args.timing_repeats):
    for i, sampling in enumerate(samplings):
      start = time.perf_counter()
      plain_batch(sampling, ())
      seconds[i].append(time.perf_counter() - start)
  timed_tokens = len(rows) * args.max_new_tokens
  plain_timings = [{"repetition_penalty": s.repetition_penalty, "tokens": timed_tokens,
                    "seconds": sorted(t), "tokens_per_s": timed_tokens / float(np.median(t))}
                   for s, t in zip(samplings, seconds)]
  results = []
  print(f"{'repetition penalty':>18} | {'drafter drafts':>17} | {'tau':>6} | {'rounds':>6} | "
        "answers == plain")
  for sampling in samplings:
    plain = plain_batch(sampling, eos)
    want = [np.asarray(plain.tokens_BxN[b, :plain.num_generated_B[b]]).tolist()
            for b in range(len(rows))]
    for name, drafter in drafters.items():
      tokens = rounds = equal = 0
      for row, expected in zip(rows, want):
        one, one_length = right_pad([row], bucket=64)
        out = setup.decode(setup.target_fns, setup.target_params, drafter, setup.params, one,
                           one_length, max_new_tokens=args.max_new_tokens, eos_ids=eos,
                           sampling=sampling, rule="strict")
        n = int(out.num_generated_B[0])
        tokens += int(out.stats.round_tokens_B[0])
        rounds += int(out.stats.rounds_B[0])
        equal += np.asarray(out.tokens_BxN[0, :n]).tolist() == expected
      result = {"repetition_penalty": sampling.repetition_penalty, "drafter_drafts": name,
                "tau": tokens / rounds, "tokens": tokens, "rounds": rounds,
                "answers_equal_to_plain": equal, "answers": len(rows)}
      results.append(result)
      print(f"{sampling.repetition_penalty:>18g} | {name:>17} | {result['tau']:6.3f} | "
            f"{rounds:6d} | {equal}/{len(rows)}", flush=True)
  base = plain_timings[0]["tokens_per_s"]
  for timing in plain_timings:
    print(f"plain decoding, {len(rows)} rows in one batch, repetition penalty "
          f"{timing['repetition_penalty']:g}: {timing['tokens_per_s']:.1f} tok/s, median of "
          f"{args.timing_repeats} ({timing['tokens_per_s'] / base:.3f}x the first setting)")
  if args.json:
    config = {k: v for k, v in vars(args).items() if k != "json"}
    with open(args.json, "w") as f:
      json.dump({"config": config, "prompts": [p.prompt_id for p in prompts],
                 "results": results, "plain_timings": plain_timings}, f, indent=1)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
