"""Real-decoding tau of several drafters on the same prompts (strict, T = 0):

  python scripts/drafter_tau.py --draft drafters/smollm2-135m-eagle3,out/drafters/vsd \
      --tree 4,4,16 --num-prompts 10 --max-new-tokens 128 --json out/drafter_tau.json

tau is DecodeStats' definition (committed tokens / verification rounds) pooled over each
suite's prompts; strict verification, so every drafter produces the target's greedy text and
only the number of rounds differs. Prompts: the first N of MT-Bench (first turns) and of
HumanEval, none of which the drafters were trained on (vsd_jax/training_prompts.py). Batch 1,
EOS honoured (the natural answers), so all drafters decode identical token sequences.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from asd_jax.cli_common import check_output_path, check_positive_flags, run_cli


def check_args(args):
  """(suites, tree shape or None, drafter names): every flag checked before the target loads."""
  from asd_jax.bench_prompts import parse_suites
  from asd_jax.cli_common import split_list_flag
  from asd_jax.draft_tree import TreeShape
  from models.drafter_setup import check_drafter_request
  check_positive_flags(args, "k", "num_prompts", "max_new_tokens")
  suites = parse_suites(args.suite)
  tree = TreeShape.parse(args.tree) if args.tree else None
  drafts = split_list_flag(args.draft, "--draft")
  for draft in drafts:
    check_drafter_request(draft, None, tree)
  if args.json:
    check_output_path(args.json, "--json")
  return suites, tree, drafts


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--draft", required=True, help="comma-separated drafter folders or names")
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--tree", default="4,4,16", help="DEPTH,TOPK,NODES ('' for chains)")
  p.add_argument("--k", type=int, default=4, help="chain length when --tree is empty")
  p.add_argument("--suite", default="mt_bench,humaneval")
  p.add_argument("--num-prompts", type=int, default=10)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--json", default="")
  return p


@run_cli
def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  suites, tree, drafts = check_args(args)

  import jax
  from asd_jax.bench_prompts import load_prompts
  from models.drafter_setup import setup_drafter
  from models.load import load_decoder
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  loaded = load_decoder(args.target)
  tok = load_tokenizer(args.target)
  check_tokenizer_fits(tok, loaded.cfg.vocab_size, args.target)
  eos = eos_token_ids(tok, loaded.hf_config)
  prompts = load_prompts(suites, args.num_prompts)
  results = {"config": vars(args), "drafters": {}}
  outputs = {}
  for draft in drafts:
    setup = setup_drafter(draft, loaded, k=args.k, tree=tree, target_name=args.target)
    per_suite: dict[str, list[int]] = {}
    start = time.perf_counter()
    for bp in prompts:
      ids = encode_chat(tok, bp.text)
      width = -(-len(ids) // 64) * 64  # bucket prompt widths: few compilations
      prompt = np.zeros((1, width), np.int32)
      prompt[0, :len(ids)] = ids
      out = setup.decode(setup.target_fns, setup.target_params, setup.drafter, setup.params,
                         prompt, np.array([len(ids)], np.int32),
                         max_new_tokens=args.max_new_tokens, rule="strict", eos_ids=eos)
      n, rounds, round_tokens, accepted = (int(x[0]) for x in jax.device_get(
          (out.num_generated_B, out.stats.rounds_B, out.stats.round_tokens_B,
           out.stats.accepted_B)))
      tokens = np.asarray(out.tokens_BxN)[0, :n].tolist()
      previous = outputs.setdefault(bp.prompt_id, tokens)
      s = per_suite.setdefault(bp.suite, [0, 0, 0, 0, 0])
      s[0] += rounds
      s[1] += round_tokens
      s[2] += n
      s[3] += int(previous != tokens)
      s[4] += accepted
    # accepted_drafts gives the tau recorded before 2026-12-07, (accepted + rounds) / rounds,
    # which also counted the unoutput bonus token of a round that ended an answer on a draft.
    row = {suite: {"tau": v[1] / max(v[0], 1), "rounds": v[0], "tokens": v[2],
                   "accepted_drafts": v[4], "outputs_differing_from_first_drafter": v[3]}
           for suite, v in per_suite.items()}
    rounds = sum(v[0] for v in per_suite.values())
    row["all"] = {"tau": sum(v[1] for v in per_suite.values()) / max(rounds, 1),
                  "rounds": rounds, "accepted_drafts": sum(v[4] for v in per_suite.values())}
    row["seconds"] = round(time.perf_counter() - start, 1)
    results["drafters"][draft] = row
    print(draft, json.dumps(row), flush=True)
  names = list(results["drafters"])
  base = results["drafters"][names[0]]
  print("\n| drafter | " + " | ".join(f"tau {s}" for s in base if s != "seconds") + " |")
  print("|---|" + "---|" * (len(base) - 1))
  for name in names:
    r = results["drafters"][name]
    # A first drafter with no rounds at all (every answer ended at the prefill) has no ratio.
    cells = [f"{r[s]['tau']:.3f} " + (f"({r[s]['tau'] / base[s]['tau']:.3f}x)"
                                      if base[s]["tau"] else "(-)") for s in base
             if s != "seconds"]
    print(f"| {name} | " + " | ".join(cells) + " |")
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
