"""`python -m asd_jax.generate`: generate text with plain or speculative decoding.

Examples:
  python -m asd_jax.generate --prompt "What is the capital of France?"
  python -m asd_jax.generate --pair smollm2-135m --prompt "..."   # target + its drafter, strict
  python -m asd_jax.generate --target path/to/hf_folder --prompt-ids 1,2,3 --json
  python -m asd_jax.generate --prompt "..." --draft smollm2-135m-standalone --rule asd --k 4
  python -m asd_jax.generate --prompt "..." --draft ngram+store --rule asd --asd-preset exploratory
  python -m asd_jax.generate --prompt "..." --draft self --rule strict      # self-draft check
  python -m asd_jax.generate --prompt "..." --draft DIR --tree 4,4,16 --rule asd
  python -m asd_jax.generate --prompt "..." --draft ngram --k 3 --stream   # print as it goes

Without --draft: plain decoding. With --draft: --rule strict (default; output == plain greedy),
asd (--asd-preset, --budget/--gate/--max-exceptions; greedy only) or sample (lossless, uses
--temperature). Without --k a shipped drafter drafts at the K its benchmarks ran it at on this
backend (models/drafter_setup.BENCHMARKED_K), any other at 4.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import jax
import numpy as np

from asd_jax.cli_common import (attach_dash_values, enable_compilation_cache, parse_prompt_ids,
                                right_pad, run_cli, text_stream)
from asd_jax.asd_config import PRESETS, preset_with
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.sampling_keys import row_keys
from asd_jax.draft_tree import TreeShape
from asd_jax.spec_decode import RULES
from configs.model_pairs import apply_pair


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m asd_jax.generate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m",
                 help="HF folder, GGUF file, or a known name (default: smollm2-135m)")
  p.add_argument("--pair", help="a named model pair (configs/model_pairs.py, e.g. smollm2-135m): "
                 "sets --target and --draft")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--prompt", help="user message; the chat template is applied")
  src.add_argument("--prompt-ids", help="raw comma-separated token ids, no template")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  p.add_argument("--top-k", type=int, default=0, help="0 = off")
  p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="parameter/activation dtype (float32 on CPU, bfloat16 on TPU/GPU)")
  p.add_argument("--weight-blocks", action=argparse.BooleanOptionalAction, default=True,
                 help="compute with a GGUF target's Q4_1/Q8_0 blocks on the CPU (the same "
                 "weights and results at a fifth of the bytes; default) or its float32 copy only")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--stream", action="store_true",
                 help="print the answer as it is generated (tokens/s then include the printing)")
  spec = p.add_argument_group("speculative decoding")
  spec.add_argument("--draft", help="drafter: a known name, a drafter folder, 'ngram' / "
                    "'ngram:MAX' / 'ngram:MIN-MAX' (model-free n-gram lookup in the prompt and "
                    "output; '+store' adds the target's shipped n-gram store as a fallback), "
                    "or 'self' (the target drafts for itself; a correctness check, "
                    "not a speedup)")
  spec.add_argument("--rule", choices=RULES, help="verification rule (default: strict with a "
                    "draft; plain decoding without)")
  spec.add_argument("--drafter", choices=("standalone", "eagle3", "medusa", "ngram"),
                    help="drafter kind (default: read from the drafter folder's config.json)")
  spec.add_argument("--k", type=int, help="draft block length K of a chain (default: the "
                    "K the drafter was benchmarked at on this backend, else 4)")
  spec.add_argument("--tree", help="DEPTH,TOPK,NODES: tree drafting (EAGLE-2 dynamic trees; "
                    "Medusa static trees); chain drafting when absent")
  presets = ", ".join(f"{name} (B={c.budget:g}, g={c.gate:g}, M={c.max_exceptions})"
                      for name, c in PRESETS.items())
  spec.add_argument("--asd-preset", metavar="NAME",
                    help=f"ASD settings (default paper): {presets}; the flags below replace "
                    "one value each")
  spec.add_argument("--budget", type=float, help="ASD regret budget B")
  spec.add_argument("--gate", type=float, help="ASD local gate g")
  spec.add_argument("--max-exceptions", type=int, help="ASD per-block exception cap M")
  spec.add_argument("--normalize-q", action="store_true", default=None,
                    help="ASD q = (K - i) / K")
  return p


ASD_FLAGS = (("--asd-preset", "asd_preset"), ("--budget", "budget"), ("--gate", "gate"),
             ("--max-exceptions", "max_exceptions"), ("--normalize-q", "normalize_q"))


def check_asd_flags_apply(args) -> None:
  """An ASD setting only acts under --rule asd; given with any other rule it would be ignored
  without a word, so it is refused."""
  given = [flag for flag, field in ASD_FLAGS if getattr(args, field) is not None]
  if given and args.rule != "asd":
    now = f"--rule {args.rule}" if args.rule else (
        "the default --rule strict" if args.draft else "plain decoding (no --draft)")
    raise ValueError(f"{given[0]} sets the ASD rule, which this run does not use ({now}); "
                     "pass --draft and --rule asd, or drop it")


@run_cli
def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  parser = build_parser()
  args = parser.parse_args(attach_dash_values(argv, ("--prompt-ids",)))
  apply_pair(args, parser)
  sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  if args.max_new_tokens <= 0:
    raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
  if args.prompt is not None and not args.prompt.strip():
    raise ValueError("empty prompt: --prompt is blank")
  # Every flag is checked before the (slow) model load, so a typo fails in milliseconds.
  ids = parse_prompt_ids(args.prompt_ids) if args.prompt is None else None
  if args.draft is None and args.rule is not None:
    raise ValueError(f"--rule {args.rule} needs a drafter: pass --draft")
  if args.k is not None and args.k <= 0:
    raise ValueError(f"--k must be a positive integer, got {args.k}")
  if args.stream and args.json:
    raise ValueError("--stream prints text as it arrives; it cannot be combined with --json")
  asd_config = preset_with(args.asd_preset or "paper", budget=args.budget, gate=args.gate,
                           max_exceptions=args.max_exceptions, normalize_q=args.normalize_q)
  check_asd_flags_apply(args)
  tree = None if args.tree is None else TreeShape.parse(args.tree)  # "" is a typo, not "chain"
  if tree is not None and args.k is not None:
    raise ValueError(f"--k sets a chain's length; with --tree {args.tree} the tree's DEPTH is "
                     "the draft length, so drop --k")
  if args.draft is not None:
    from models.drafter_setup import check_drafter_request
    check_drafter_request(args.draft, args.drafter, tree)
  row_keys(args.seed, 1)  # refuses a seed outside [0, 2**32)
  from models.registry import resolve_checkpoint
  resolve_checkpoint(args.target)  # an empty or unknown --target, before the slow load
  enable_compilation_cache()

  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  loaded = load_decoder(args.target, dtype=args.dtype, weight_blocks=args.weight_blocks)
  tokenizer = load_tokenizer(args.target)
  check_tokenizer_fits(tokenizer, loaded.model.cfg.vocab_size, args.target)
  load_s = time.perf_counter() - t0
  if ids is None:
    ids = encode_chat(tokenizer, args.prompt)
  eos = () if args.ignore_eos else eos_token_ids(tokenizer, loaded.hf_config)
  fns, params = decoder_fns(loaded.model, name=args.target)
  prompt, lengths = right_pad([ids])
  stream = text_stream(tokenizer) if args.stream else None

  if args.draft is None:
    t0 = time.perf_counter()
    result = jax.block_until_ready(plain_decode(
        fns, params, prompt, lengths, max_new_tokens=args.max_new_tokens, eos_ids=eos,
        sampling=sampling, seed=args.seed, stream=stream))
    wall_s = time.perf_counter() - t0
    stats = {"mode": "plain", "target_forwards": int(result.target_forwards_B[0]), "tau": 1.0}
  else:
    rule = args.rule or "strict"
    from models.drafter_setup import default_k, setup_drafter
    k = args.k or default_k(args.draft, jax.default_backend())
    setup = setup_drafter(args.draft, loaded, k=k, tree=tree, kind=args.drafter,
                          dtype=args.dtype, target_name=args.target)
    t0 = time.perf_counter()
    result = jax.block_until_ready(setup.decode(
        setup.target_fns, setup.target_params, setup.drafter, setup.params, prompt, lengths,
        max_new_tokens=args.max_new_tokens, rule=rule, asd_config=asd_config,
        sampling=sampling, eos_ids=eos, seed=args.seed, stream=stream))
    wall_s = time.perf_counter() - t0
    summary = result.stats.summary()
    stats = {"mode": "speculative", "rule": rule, "k": None if tree else k, "draft": args.draft,
             "drafter": setup.kind, "engine": setup.engine, "tree": args.tree,
             "rounds": summary["rounds"], "tau": summary["tau"],
             "accepted_per_position": summary["accepted_per_position"],
             "asd_exceptions": summary["asd_exceptions"][0],
             "asd_spent": summary["asd_spent"][0]}
    if rule == "asd":
      stats["asd_config"] = {"preset": args.asd_preset or "paper", "budget": asd_config.budget,
                             "gate": asd_config.gate, "max_exceptions": asd_config.max_exceptions,
                             "normalize_q": asd_config.normalize_q}

  n = int(result.num_generated_B[0])
  tokens = np.asarray(result.tokens_BxN[0, :n]).tolist()
  nonfinite = bool(result.nonfinite_B[0])
  text = tokenizer.decode(tokens, skip_special_tokens=True)
  stats.update({
      "prompt_tokens": len(ids),
      "new_tokens": n,
      "load_s": round(load_s, 3),
      "wall_s": round(wall_s, 3),  # includes compilation unless the persistent cache had it
      "tokens_per_s": round(n / wall_s, 2),
      "dtype": args.dtype,
      "backend": jax.default_backend(),
      "nonfinite_logits": nonfinite,
  })
  if args.json:
    print(json.dumps({"tokens": tokens, "text": text, "stats": stats}))
  else:
    print("" if args.stream else text)
    print(f"\n[{n} tokens in {wall_s:.2f} s ({n / wall_s:.1f} tok/s incl. compile), "
          f"load {load_s:.2f} s]")
  if nonfinite:  # after the output, so the tokens before the bad step are not lost
    raise ValueError(f"the model produced non-finite logits after {n} tokens; generation "
                     f"stopped there (the output above is complete up to that point)")


if __name__ == "__main__":
  main()
