"""Where strict speculative decoding and plain greedy decoding part, per dtype:

  python scripts/strict_vs_plain_dtypes.py --num-prompts 5 --max-new-tokens 64 \
      --json out/strict_vs_plain_dtypes.json

For each dtype, both engines decode the same prompts (the first N of each suite, one padded
batch); every row whose outputs differ is listed with the first differing position and the
target's top-2 margin there (one full forward over plain's prefix), absolute and relative to
the top logit. On the CPU kernels float32 verification reproduces plain decoding bit for bit;
bfloat16 rounds a verification block otherwise than one-token steps, so rows may part at
near-ties (README, "Guarantees and where they are tested").
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from asd_jax.cli_common import check_output_path, check_positive_flags, run_cli

DTYPES = ("float32", "bfloat16")


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--draft", default="smollm2-135m-standalone")
  p.add_argument("--k", type=int, default=2)
  p.add_argument("--suite", default="mt_bench,humaneval")
  p.add_argument("--num-prompts", type=int, default=5, help="per suite")
  p.add_argument("--max-new-tokens", type=int, default=64)
  p.add_argument("--dtypes", default=",".join(DTYPES))
  p.add_argument("--json", default="")
  return p


def check_args(args):
  """(suites, dtypes): every flag checked before the target loads."""
  from asd_jax.bench_prompts import parse_suites
  from asd_jax.cli_common import split_list_flag
  from models.drafter_setup import check_drafter_request
  check_positive_flags(args, "k", "num_prompts", "max_new_tokens")
  dtypes = split_list_flag(args.dtypes, "--dtypes")
  unknown = [d for d in dtypes if d not in DTYPES]
  if unknown:
    raise ValueError(f"--dtypes: unknown {unknown}; choose from {list(DTYPES)}")
  check_drafter_request(args.draft, None, None)
  if args.json:
    check_output_path(args.json, "--json")
  return parse_suites(args.suite), dtypes


def first_differences(fns, params, rows, plain_BxN, spec_BxN) -> list[dict]:
  """Each differing row's first differing position and the target's top-2 margin there."""
  import jax
  import jax.numpy as jnp
  from asd_jax.request_checks import round_up
  forward = jax.jit(fns.forward)
  out = []
  for b, row in enumerate(rows):
    if np.array_equal(plain_BxN[b], spec_BxN[b]):
      continue
    at = int(np.argmax(plain_BxN[b] != spec_BxN[b]))
    prefix = list(row) + plain_BxN[b, :at].tolist()
    width = round_up(len(prefix), 64)
    ids = np.zeros((1, width), np.int32)
    ids[0, :len(prefix)] = prefix
    logits = forward(params, jnp.asarray(ids), jnp.arange(width)[None],
                     fns.init_cache(1, width))[0]
    top2 = np.sort(np.asarray(logits[0, len(prefix) - 1], np.float64))[-2:]
    margin = float(top2[1] - top2[0])
    out.append({"row": b, "position": at, "margin": margin, "top_logit": float(top2[1]),
                "relative_margin": margin / max(abs(float(top2[1])), 1.0)})
  return out


@run_cli
def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  suites, dtypes = check_args(args)
  from asd_jax.bench_prompts import load_prompts
  from asd_jax.cli_common import right_pad
  from asd_jax.plain_decode import plain_decode
  from models.drafter_setup import setup_drafter
  from models.load import load_decoder
  from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer

  tokenizer = load_tokenizer(args.target)
  prompts = load_prompts(suites, args.num_prompts)
  rows = [encode_chat(tokenizer, p.text) for p in prompts]
  prompt, lengths = right_pad(rows, bucket=64)
  results = {}
  for dtype in dtypes:
    target = load_decoder(args.target, dtype=dtype)
    check_tokenizer_fits(tokenizer, target.cfg.vocab_size, args.target)
    setup = setup_drafter(args.draft, target, k=args.k, dtype=dtype, target_name=args.target)
    plain = plain_decode(setup.target_fns, setup.target_params, prompt, lengths,
                         max_new_tokens=args.max_new_tokens)
    spec = setup.decode(setup.target_fns, setup.target_params, setup.drafter, setup.params,
                        prompt, lengths, max_new_tokens=args.max_new_tokens, rule="strict")
    diffs = first_differences(setup.target_fns, setup.target_params, rows,
                              np.asarray(plain.tokens_BxN), np.asarray(spec.tokens_BxN))
    results[dtype] = {"rows": len(rows), "rows_differing": len(diffs), "differences": diffs}
    worst = max((d["relative_margin"] for d in diffs), default=0.0)
    print(f"{dtype:>9}: {len(diffs)}/{len(rows)} rows differ from plain greedy; largest "
          f"relative top-2 margin at a difference {worst:.4f}")
    for d in diffs:
      print(f"           row {d['row']}: position {d['position']}, margin {d['margin']:.4f} "
            f"(top logit {d['top_logit']:.2f})")
  if args.json:
    config = {k: v for k, v in vars(args).items() if k != "json"}
    with open(args.json, "w") as f:
      json.dump({"config": config, "prompts": [p.prompt_id for p in prompts],
                 "results": results}, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
