"""`python -m asd_jax.bench`: decoding throughput on MT-Bench / HumanEval prompts.

Every row decodes the same chat-encoded prompts; throughput is completion tokens / wall-clock of
the whole calls (prefill included, compile excluded: each row warms up first). By default EOS
is ignored, so every row generates exactly --max-new-tokens per prompt (a fixed workload);
--natural-eos lets rows stop at EOS instead.

Modes (rows):
  ar   ours_plain_greedy (asd_jax.plain_decode), transformers_generate_greedy (reference)

Examples:
  python -m asd_jax.bench --mode ar --json out/bench_ar.json
  python -m asd_jax.bench --suite humaneval --num-prompts 4 --max-new-tokens 64 --skip-transformers
  python -m asd_jax.bench --mode spec --draft smollm2-135m-standalone --k 4 --tree 4,4,16
"""

from __future__ import annotations

import argparse
import os
import sys

from asd_jax.bench_prompts import SUITES, load_prompts, parse_suites
from asd_jax.bench_rows import (BenchContext, PreparedRow, RowRunner, make_batches,
                               ours_plain_greedy, run_rows)
from asd_jax.cli_common import enable_compilation_cache, run_cli


def _transformers_row(ctx: BenchContext) -> PreparedRow:
  from asd_jax.bench_transformers import transformers_generate_greedy  # imports torch
  return transformers_generate_greedy(ctx)


RUNNERS: dict[str, RowRunner] = {
    "ours_plain_greedy": ours_plain_greedy,
    "transformers_generate_greedy": _transformers_row,
}
MODE_ROWS = {
    "ar": ("ours_plain_greedy", "transformers_generate_greedy"),
    # spec: plain decoding plus, per --draft, strict and ASD (paper preset) chains and, with
    # --tree, the same over trees; rows are added in main() from the flags.
    "spec": ("ours_plain_greedy",),
}
TRANSFORMERS_ROWS = frozenset({"transformers_generate_greedy"})


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m asd_jax.bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m",
                 help="HF folder, GGUF file, or a known name (default: smollm2-135m)")
  p.add_argument("--mode", choices=sorted(MODE_ROWS), default="ar",
                 help="which rows to run (default: ar)")
  p.add_argument("--suite", default=",".join(SUITES),
                 help=f"comma-separated prompt suites from {', '.join(SUITES)} (default: both)")
  p.add_argument("--num-prompts", type=int, default=8, help="prompts per suite (default: 8)")
  p.add_argument("--max-new-tokens", type=int, default=128)
  eos = p.add_mutually_exclusive_group()
  eos.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="generate exactly --max-new-tokens per prompt (default)")
  eos.add_argument("--natural-eos", dest="ignore_eos", action="store_false",
                   help="stop each prompt at its first EOS")
  p.add_argument("--batch-size", type=int, default=1, help="prompts per call (default: 1)")
  p.add_argument("--repeats", type=int, default=1,
                 help="timed passes over the prompts after the warm-up (default: 1)")
  p.add_argument("--skip-transformers", action="store_true",
                 help="leave out the transformers reference row")
  p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
  spec = p.add_argument_group("--mode spec")
  spec.add_argument("--draft", default="smollm2-135m-standalone",
                    help="comma-separated drafters (names, folders, or 'self')")
  spec.add_argument("--k", type=int, default=4, help="chain block length K (default 4)")
  spec.add_argument("--tree", help="DEPTH,TOPK,NODES: also run tree rows")
  spec.add_argument("--no-chain", action="store_true", help="tree rows only")
  return p


def spec_runners(args) -> dict[str, RowRunner]:
  """The speculative rows --mode spec adds, by name, in run order."""
  from asd_jax.bench_spec_rows import row_name, spec_row
  from asd_jax.draft_tree import TreeShape
  if args.k <= 0:
    raise ValueError(f"--k must be positive, got {args.k}")
  tree = TreeShape.parse(args.tree) if args.tree else None
  shapes = ([] if args.no_chain else [None]) + ([tree] if tree else [])
  if not shapes:
    raise ValueError("--no-chain needs --tree")
  runners = {}
  for draft in [d for d in args.draft.split(",") if d]:
    for shape in shapes:
      for rule in ("strict", "asd"):
        runners[row_name(draft, shape, args.k, rule, "paper")] = spec_row(
            draft, k=args.k, tree=shape, rule=rule)
  return runners


def _check_args(args) -> tuple[str, ...]:
  suites = parse_suites(args.suite)
  for flag, value in (("--num-prompts", args.num_prompts),
                      ("--max-new-tokens", args.max_new_tokens),
                      ("--batch-size", args.batch_size), ("--repeats", args.repeats)):
    if value <= 0:
      raise ValueError(f"{flag} must be positive, got {value}")
  return suites


def config_dict(args, suites: tuple[str, ...], rows: tuple[str, ...]) -> dict:
  return {"target": args.target, "mode": args.mode, "suites": list(suites),
          "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
          "ignore_eos": args.ignore_eos, "batch_size": args.batch_size,
          "repeats": args.repeats, "skip_transformers": args.skip_transformers,
          "rows": list(rows)}


@run_cli
def main(argv=None):
  args = build_parser().parse_args(argv)
  suites = _check_args(args)
  rows = tuple(r for r in MODE_ROWS[args.mode]
               if not (args.skip_transformers and r in TRANSFORMERS_ROWS))
  runners = dict(RUNNERS)
  if args.mode == "spec":
    extra = spec_runners(args)
    runners.update(extra)
    rows = rows + tuple(extra)
  prompts = load_prompts(suites, args.num_prompts)
  enable_compilation_cache()

  from tqdm.auto import tqdm

  from asd_jax import bench_report
  from models.tokenizer import encode_chat, eos_token_ids, load_tokenizer

  load_at_start = bench_report.load_average()
  tokenizer = load_tokenizer(args.target)
  encoded = [(p.suite, encode_chat(tokenizer, p.text)) for p in prompts]
  ctx = BenchContext(target=args.target, tokenizer=tokenizer,
                     batches=make_batches(encoded, args.batch_size),
                     max_new_tokens=args.max_new_tokens, eos_ids=(), batch_size=args.batch_size,
                     repeats=args.repeats,
                     progress=lambda **kw: tqdm(file=sys.stderr, leave=False, **kw))
  if not args.ignore_eos:
    ctx.eos_ids = eos_token_ids(tokenizer, ctx.jax_target[2].hf_config)

  results = run_rows(ctx, [runners[name](ctx) for name in rows])
  table_rows = bench_report.row_dicts(results)
  config = config_dict(args, suites, rows)
  config["prompt_ids"] = {s: [p.prompt_id for p in prompts if p.suite == s] for s in suites}
  config["prompt_tokens"] = [len(ids) for _, ids in encoded]
  print(f"{args.target} | mode {args.mode} | {', '.join(suites)} x {args.num_prompts} prompts | "
        f"max_new_tokens {args.max_new_tokens} | "
        f"{'EOS ignored' if args.ignore_eos else 'natural EOS'} | batch {args.batch_size} | "
        f"repeats {args.repeats}")
  print(bench_report.format_table(table_rows))
  load = bench_report.load_average()
  if load is not None and load > (os.cpu_count() or 1):
    print(f"note: 1-minute load average {load} > {os.cpu_count()} cores: other processes "
          "competed for the CPU, so these throughputs are pessimistic", file=sys.stderr)
  if args.json:
    bench_report.write_json(args.json, bench_report.machine_info(load_at_start), config, table_rows)
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
