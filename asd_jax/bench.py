"""`python -m asd_jax.bench`: decoding throughput on MT-Bench / HumanEval prompts.

Every row decodes the same chat-encoded prompts; throughput is completion tokens / wall-clock of
the whole calls (prefill included, compile excluded: each row warms up first). By default EOS
is ignored, so every row generates exactly --max-new-tokens per prompt (a fixed workload);
--natural-eos lets rows stop at EOS instead.

Modes (rows):
  ar     ours_plain_greedy (asd_jax.plain_decode), transformers_generate_greedy (reference)
  spec   ours_plain_greedy, then per --draft strict and ASD (paper preset) rows, chain and/or
         tree; --asd-budgets, --calibrate-prompts, --protocol, --quality, --assisted add more
  suite  spec plus everything: transformers generate and assisted generation, the calibrated
         ASD preset, the paper's strict -> ASD -> strict protocol and natural-EOS quality runs
         (asd_jax/bench_suite.py describes the order)
  --llama-cpp adds llama.cpp greedy decoding on the same float32 weights to any mode

Examples:
  python -m asd_jax.bench --mode ar --json out/bench_ar.json
  python -m asd_jax.bench --pair smollm2-135m --suite mt_bench,humaneval --json out/pair.json
  python -m asd_jax.bench --suite humaneval --num-prompts 4 --max-new-tokens 64 --skip-transformers
  python -m asd_jax.bench --mode spec --draft smollm2-135m-standalone --k 4 --tree 4,4,16
  python -m asd_jax.bench --mode suite --k 2 --asd-budgets 0,1,2,4,8 --json out/suite.json
"""

from __future__ import annotations

import argparse
import os
import sys

from asd_jax.asd_config import PAPER
from asd_jax.bench_prompts import SUITES, load_prompts, parse_suites
from asd_jax.bench_protocol import SCHEDULES
from asd_jax.bench_rows import (PROMPT_BUCKET, BenchContext, PreparedRow, RowRunner,
                               make_batches, ours_plain_greedy, run_rows)
from asd_jax.cli_common import (check_output_path, check_positive_flags,
                               enable_compilation_cache, run_cli, split_list_flag)
from configs.model_pairs import apply_pair


def _transformers_row(ctx: BenchContext) -> PreparedRow:
  from asd_jax.bench_transformers import transformers_generate_greedy  # imports torch
  return transformers_generate_greedy(ctx)


def _llama_cpp_row(ctx: BenchContext) -> PreparedRow:
  from asd_jax.bench_llama_cpp import llama_cpp_greedy  # imports llama_cpp (optional)
  return llama_cpp_greedy(ctx)


RUNNERS: dict[str, RowRunner] = {
    "ours_plain_greedy": ours_plain_greedy,
    "transformers_generate_greedy": _transformers_row,
    "llama_cpp_greedy": _llama_cpp_row,
}
MODE_ROWS = {
    "ar": ("ours_plain_greedy", "transformers_generate_greedy"),
    # spec: plain decoding plus, per --draft, strict and ASD (paper preset) chains and, with
    # --tree, the same over trees; rows are added in main() from the flags.
    "spec": ("ours_plain_greedy",),
    "suite": ("ours_plain_greedy", "transformers_generate_greedy"),
}
TRANSFORMERS_ROWS = frozenset({"transformers_generate_greedy"})


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m asd_jax.bench", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m",
                 help="HF folder, GGUF file, or a known name (default: smollm2-135m)")
  p.add_argument("--pair", help="a named model pair (configs/model_pairs.py, e.g. smollm2-135m): "
                 "sets --target and --draft, and --mode spec unless --mode is given")
  p.add_argument("--mode", choices=sorted(MODE_ROWS),
                 help="which rows to run (default: ar; spec with --pair)")
  p.add_argument("--suite", default=",".join(SUITES),
                 help=f"comma-separated prompt suites from {', '.join(SUITES)} (default: both)")
  p.add_argument("--num-prompts", type=int, default=8,
                 help="the first N prompts of each suite; a suite with fewer (MT-Bench has 80, "
                 "HumanEval 164) gives all of its own, so 164 runs both whole (default: 8)")
  p.add_argument("--max-new-tokens", type=int, default=128)
  eos = p.add_mutually_exclusive_group()
  eos.add_argument("--ignore-eos", dest="ignore_eos", action="store_true", default=True,
                   help="generate exactly --max-new-tokens per prompt (default)")
  eos.add_argument("--natural-eos", dest="ignore_eos", action="store_false",
                   help="stop each prompt at its first EOS")
  p.add_argument("--batch-size", type=int, default=1, help="prompts per call (default: 1)")
  p.add_argument("--repeats", type=int, default=1,
                 help="timed passes over the prompts after the warm-up (default: 1)")
  p.add_argument("--prompt-bucket", type=int, default=PROMPT_BUCKET, metavar="N",
                 help="pad prompts to a multiple of N tokens, one compiled program per padded "
                 f"width (default {PROMPT_BUCKET}; on an accelerator, where padding a prefill "
                 "is almost free and a compile takes seconds, a width past the longest prompt "
                 "compiles each row once)")
  p.add_argument("--skip-transformers", action="store_true",
                 help="leave out the transformers reference row")
  p.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
  p.add_argument("--weight-blocks", action=argparse.BooleanOptionalAction, default=True,
                 help="our rows compute with a GGUF target's Q4_1/Q8_0 blocks (the same weights "
                 "and results, fewer bytes per step; default) or with its float32 copy only")
  p.add_argument("--llama-cpp", action="store_true",
                 help="add llama.cpp greedy decoding on the same float32 weights (needs the "
                 "optional llama-cpp-python; a GGUF target)")
  spec = p.add_argument_group("--mode spec")
  spec.add_argument("--draft", default="smollm2-135m-standalone",
                    help="comma-separated drafters (names, folders, 'ngram[:MIN-MAX][+store]' or "
                    "'self'), each optionally NAME@K for its own chain length")
  spec.add_argument("--k", type=int, help="chain block length K for every drafter without its "
                    "own @K (default: the K generate drafts at, per drafter and backend: "
                    "models/drafter_setup.BENCHMARKED_K, else 4)")
  spec.add_argument("--tree", help="DEPTH,TOPK,NODES: also run tree rows (for every drafter "
                    "but the n-gram ones, which draft chains only)")
  spec.add_argument("--no-chain", action="store_true", help="tree rows only")
  suite = p.add_argument_group("--mode spec / suite (suite turns all of these on)")
  suite.add_argument("--asd-budgets", metavar="B,B,...",
                     help="ASD budget sweep rows (paper gate and exception cap), e.g. 0,1,2,4,8")
  suite.add_argument("--calibrate-prompts", type=int, metavar="N",
                     help="calibrated ASD rows: calibrate_asd (q25) on the last N prompts of "
                          "each suite, disjoint from the eval prompts (suite default: 8)")
  suite.add_argument("--calibrate-max-new-tokens", type=int, metavar="N",
                     help="answer length of the calibration decodes (default: --max-new-tokens)")
  suite.add_argument("--calibration-source", choices=("suite-tail", "training"),
                     default="suite-tail",
                     help="calibration prompts: the suites' last N prompts (default) or offline "
                          "training-style prompts (for evals over whole suites)")
  suite.add_argument("--protocol", action=argparse.BooleanOptionalAction,
                     help="strict -> ASD -> strict passes for the ASD gain vs strict")
  suite.add_argument("--protocol-schedule", choices=SCHEDULES, default=SCHEDULES[0],
                     help="interleaved (default): strict, ASD, strict take turns batch by "
                          "batch, so every pass sees the same background load; whole-pass: "
                          "each pass decodes every batch before the next starts")
  suite.add_argument("--drift-tol", type=float, default=0.03,
                     help="flag a protocol triple whose strict passes differ by more (0.03)")
  suite.add_argument("--quality", action=argparse.BooleanOptionalAction,
                     help="natural-EOS rerun of our rows: NLL, share differing from strict, "
                          "HumanEval pass@1 (with --natural-eos these come from the timed rows)")
  suite.add_argument("--quality-max-new-tokens", type=int, default=256)
  suite.add_argument("--quality-rows", metavar="ROW,ROW,...",
                     help="rerun only these rows with natural EOS (default: all of ours); e.g. "
                          "a whole-suite pass@1 check of plain (= strict) vs calibrated ASD")
  suite.add_argument("--assisted", action=argparse.BooleanOptionalAction,
                     help="transformers assisted generation with the first standalone --draft")
  return p


def resolve_suite_flags(args) -> None:
  """Fills the suite flags left unset: on in --mode suite, off otherwise."""
  suite = args.mode == "suite"
  if args.calibrate_prompts is None:
    args.calibrate_prompts = 8 if suite else 0
  if args.protocol is None:
    args.protocol = suite
  if args.quality is None:
    args.quality = suite and args.ignore_eos   # natural-EOS timed rows carry their own quality
  if args.quality and not args.ignore_eos:
    raise ValueError("--quality reruns rows with natural EOS, which --natural-eos timed rows "
                     "already are: their quality columns (pass@1 included) come from them; "
                     "drop --quality")
  if args.assisted is None:
    args.assisted = suite and not args.skip_transformers
  if args.calibrate_prompts < 0:
    raise ValueError(f"--calibrate-prompts must be >= 0 (0: off), got {args.calibrate_prompts}")
  if not 0 <= args.drift_tol < float("inf"):  # NaN would never flag a drift
    raise ValueError(f"--drift-tol must be a finite number >= 0, got {args.drift_tol}")
  check_positive_flags(args, "quality_max_new_tokens")
  if args.calibrate_max_new_tokens is not None:
    check_positive_flags(args, "calibrate_max_new_tokens")
  if args.quality_rows is not None and not args.quality:
    raise ValueError("--quality-rows needs --quality (or --mode suite)")


def spec_runners(args, calibrated=None) -> dict[str, RowRunner]:
  """The speculative rows --mode spec/suite adds, by name, in run order.

  Per drafter and shape: strict, ASD paper; for the first drafter's first shape also ASD
  calibrated (with `calibrated`, an ASDConfig; chain only) and the --asd-budgets sweep.
  --tree adds tree rows for the drafters that draft trees; an n-gram drafter drafts chains
  only, so it keeps its chain rows (a suite can name it next to tree drafters).
  """
  from asd_jax.bench_spec_rows import row_name, spec_row
  from asd_jax.bench_suite import budget_preset, parse_budgets
  shapes = row_shapes(args)
  sweep = [budget_preset(b) for b in parse_budgets(args.asd_budgets)]
  runners = {}
  entries = drafts(args)
  first = entries[0]
  for draft, k in entries:
    own_shapes = drafter_shapes(draft, shapes)
    for shape in own_shapes:
      for rule in ("strict", "asd"):
        runners[row_name(draft, shape, k, rule, "paper")] = spec_row(
            draft, k=k, tree=shape, rule=rule)
      first_chain = shape is own_shapes[0] and (draft, k) == first
      presets = list(sweep) if first_chain else []
      if calibrated is not None and shape is None and (draft, k) == first:
        presets.insert(0, ("calibrated", calibrated))
      for preset, cfg in presets:
        runners[row_name(draft, shape, k, "asd", preset)] = spec_row(
            draft, k=k, tree=shape, rule="asd", asd_config=cfg, preset=preset)
  return runners


def row_shapes(args) -> list:
  """The shapes --tree / --no-chain ask for: None (the chain) and/or a TreeShape."""
  from asd_jax.draft_tree import TreeShape
  tree = None if args.tree is None else TreeShape.parse(args.tree)  # "" is a typo, not "chain"
  shapes = ([] if args.no_chain else [None]) + ([tree] if tree else [])
  if not shapes:
    raise ValueError("--no-chain needs --tree")
  return shapes


def drafter_shapes(draft: str, shapes: list) -> list:
  """`shapes` less the trees when `draft` drafts chains only (an n-gram drafter)."""
  if all(s is None for s in shapes):
    return shapes
  from models.drafter_setup import CHAIN_ONLY_KINDS, infer_kind
  if infer_kind(draft) not in CHAIN_ONLY_KINDS:
    return shapes
  chains = [s for s in shapes if s is None]
  if not chains:
    raise ValueError(f"--draft {draft}: the n-gram drafter drafts chains only, so --no-chain "
                     "leaves it no rows; drop it or --no-chain")
  return chains


def drafts(args) -> list[tuple[str, int]]:
  """(drafter, K) per comma-separated --draft entry; 'NAME@K' overrides --k for that one.

  Without either, a drafter gets the K `generate` drafts it at on this backend, so a benchmark
  row and a plain `generate --draft NAME` run the same configuration."""
  if args.k is not None and args.k <= 0:
    raise ValueError(f"--k must be positive, got {args.k}")
  if not args.draft.strip():
    raise ValueError("--draft names no drafter")
  out = []
  for entry in split_list_flag(args.draft, "--draft"):
    name, _, k = entry.partition("@")
    try:
      k = int(k) if k else (args.k if args.k is not None else _generate_default_k(name))
    except ValueError:
      raise ValueError(f"--draft {entry!r}: the part after '@' must be K, an integer") from None
    if k <= 0:
      raise ValueError(f"--draft {entry!r}: K must be positive, got {k}")
    out.append((name, k))
  return out


def _generate_default_k(draft: str) -> int:
  import jax
  from models.drafter_setup import default_k
  return default_k(draft, jax.default_backend())


def _first_standalone(args) -> str:
  """The drafter transformers' assisted generation runs: the first standalone LM drafter."""
  from models.drafter_setup import infer_kind
  for name, _ in drafts(args):
    if infer_kind(name) == "standalone" and name != "self":
      return name
  raise ValueError("--assisted needs a standalone LM drafter in --draft (transformers "
                   "assistant models are whole LMs); add one or pass --no-assisted")


# The flags only the speculative rows read (their argument groups above).
_SPEC_FLAGS = ("draft", "k", "tree", "no_chain", "asd_budgets", "calibrate_prompts",
               "calibrate_max_new_tokens", "calibration_source", "protocol", "protocol_schedule",
               "drift_tol", "quality", "quality_max_new_tokens", "quality_rows", "assisted")


def _refuse_spec_flags_in_ar(args) -> None:
  """--mode ar runs plain decoding rows only: a --tree or --quality there would be dropped
  without a word, and the user would read a table that lacks what they asked for."""
  if args.mode != "ar":
    return
  parser = build_parser()
  given = [f"--{name.replace('_', '-')}" for name in _SPEC_FLAGS
           if getattr(args, name) not in (parser.get_default(name), False)]
  if given:
    raise ValueError(f"{', '.join(given)} only appl{'y' if len(given) > 1 else 'ies'} to "
                     "--mode spec or suite; --mode ar runs plain decoding rows only")


def _apply_pair(args) -> None:
  """--pair sets the target and drafter; the mode defaults to spec then, since a pair without
  its drafter's rows is just --target."""
  if args.pair is not None and args.mode == "ar":
    raise ValueError(f"--pair {args.pair} names a drafter, but --mode ar runs plain decoding "
                     "rows only; use --mode spec or suite, or --target for plain decoding")
  apply_pair(args, build_parser())
  if args.mode is None:
    args.mode = "ar" if args.pair is None else "spec"


def _base_rows(args) -> tuple[str, ...]:
  """The rows this run makes besides the speculative ones (spec_runners), in run order."""
  rows = tuple(r for r in MODE_ROWS[args.mode]
               if not (args.skip_transformers and r in TRANSFORMERS_ROWS))
  return rows + (("llama_cpp_greedy",) if args.llama_cpp else ())


def _check_args(args) -> tuple[tuple[str, ...], list[str]]:
  """Every flag checked before the (slow) model load; returns (suites, --quality-rows)."""
  _apply_pair(args)
  from models.registry import resolve_checkpoint
  resolve_checkpoint(args.target)  # an empty or unknown --target, before the slow load
  suites = parse_suites(args.suite)
  _refuse_spec_flags_in_ar(args)
  resolve_suite_flags(args)
  from asd_jax.bench_suite import parse_budgets
  parse_budgets(args.asd_budgets)
  check_positive_flags(args, "num_prompts", "max_new_tokens", "batch_size", "repeats",
                       "prompt_bucket")
  if args.mode in ("spec", "suite"):
    shapes = row_shapes(args)   # a malformed --draft or --tree fails before the model loads
    from models.drafter_setup import check_drafter_request
    for draft, _ in drafts(args):
      check_drafter_request(draft, None, None)  # e.g. an n-gram size past the cap
      drafter_shapes(draft, shapes)
    if args.calibrate_prompts and args.calibration_source == "suite-tail":
      from asd_jax.bench_calibration import calibration_prompts  # refuses an overlap
      calibration_prompts(suites, args.num_prompts, args.calibrate_prompts)
    # The row names are the ones spec_runners makes in main: the calibrated preset's values do
    # not enter them.
    quality_rows = _quality_rows(args, _base_rows(args) + tuple(
        spec_runners(args, PAPER if args.calibrate_prompts else None)))
  else:
    quality_rows = []
  if args.json:  # written after every row has run
    check_output_path(args.json, "--json")
  if args.llama_cpp:
    from asd_jax.bench_llama_cpp import import_llama_cpp
    import_llama_cpp()
  import importlib.util
  if ((TRANSFORMERS_ROWS & set(_base_rows(args)) or args.assisted)
      and importlib.util.find_spec("torch") is None):
    # Those rows ran last of all setup, after the model load, and died importing torch.
    raise ValueError("the transformers rows (`generate`, and assisted generation in a suite) "
                     "run on torch, which asd-jax does not require and this environment "
                     "lacks: install torch (asd-jax's test extra; `make` does) or pass "
                     "--skip-transformers")
  if args.batch_size > 1:
    # Batches never mix suites: past a suite's prompt count every call pads with dummy rows
    # that cost as much as real ones (--num-prompts 1 --batch-size 256: 10x the time).
    per_suite = {s: len(load_prompts((s,), args.num_prompts)) for s in suites}
    if args.batch_size > max(per_suite.values()):
      counts = ", ".join(f"{s} {n}" for s, n in per_suite.items())
      raise ValueError(f"--batch-size {args.batch_size} exceeds the prompts per suite this run "
                       f"has ({counts}, --num-prompts {args.num_prompts}); every batch would "
                       f"be filled with dummy rows: use --batch-size "
                       f"{max(per_suite.values())} or less")
  return suites, quality_rows


def _other_engine(row: str) -> bool:
  """A row of another engine (row name or runner key): no natural-EOS quality rerun for it."""
  return row == "assisted" or row.startswith(("transformers_", "llama_cpp_"))


def _quality_rows(args, rows: tuple[str, ...]) -> list[str]:
  """--quality-rows checked against the rows this run makes (before any of them runs)."""
  if args.quality_rows is None:
    return []
  text = args.quality_rows
  wanted = split_list_flag(text, "--quality-rows") if text.strip() else []
  ours = [r for r in rows if not _other_engine(r)]
  unknown = [r for r in wanted if r not in ours]
  if unknown or not wanted:
    raise ValueError(f"--quality-rows: {', '.join(unknown) or 'no rows given'}; this run's own "
                     f"rows are {', '.join(ours)}")
  return wanted


def config_dict(args, suites: tuple[str, ...], rows: tuple[str, ...]) -> dict:
  return {"pair": args.pair, "target": args.target, "mode": args.mode, "suites": list(suites),
          "num_prompts": args.num_prompts, "max_new_tokens": args.max_new_tokens,
          "ignore_eos": args.ignore_eos, "batch_size": args.batch_size,
          "repeats": args.repeats, "skip_transformers": args.skip_transformers,
          "llama_cpp": args.llama_cpp, "weight_blocks": args.weight_blocks,
          "prompt_bucket": args.prompt_bucket,
          "draft": args.draft, "k": args.k, "tree": args.tree,
          "asd_budgets": args.asd_budgets, "calibrate_prompts": args.calibrate_prompts,
          "calibration_source": args.calibration_source,
          "protocol": args.protocol, "protocol_schedule": args.protocol_schedule,
          "drift_tol": args.drift_tol, "quality": args.quality,
          "quality_max_new_tokens": args.quality_max_new_tokens,
          "quality_rows": args.quality_rows,
          "calibrate_max_new_tokens": args.calibrate_max_new_tokens, "assisted": args.assisted,
          "rows": list(rows)}


@run_cli
def main(argv=None):
  args = build_parser().parse_args(argv)
  suites, quality_rows = _check_args(args)
  rows = _base_rows(args)
  prompts = load_prompts(suites, args.num_prompts)
  enable_compilation_cache()

  from tqdm.auto import tqdm

  from asd_jax import bench_report, bench_suite, compiled_programs
  from asd_jax.request_checks import check_context
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  load_at_start = bench_report.load_average()
  tokenizer = load_tokenizer(args.target)
  encoded = [(p.suite, encode_chat(tokenizer, p.text)) for p in prompts]
  ctx = BenchContext(target=args.target, tokenizer=tokenizer, weight_blocks=args.weight_blocks,
                     prompt_bucket=args.prompt_bucket,
                     batches=make_batches(encoded, args.batch_size),
                     max_new_tokens=args.max_new_tokens, eos_ids=(), batch_size=args.batch_size,
                     repeats=args.repeats,
                     progress=lambda **kw: tqdm(file=sys.stderr, leave=False, **kw))
  check_tokenizer_fits(tokenizer, ctx.jax_target[2].model.cfg.vocab_size, args.target)
  if not args.ignore_eos:
    ctx.eos_ids = eos_token_ids(tokenizer, ctx.jax_target[2].hf_config)
  # Past the target's context window every one of our rows would fail: say so before any row
  # (or the calibration) runs.
  check_context(ctx.jax_target[0].max_positions, [len(ids) for _, ids in encoded],
                max(args.max_new_tokens, args.quality_max_new_tokens if args.quality else 0),
                args.target)

  runners = dict(RUNNERS)
  calibrated, calibration = None, None
  if args.mode in ("spec", "suite"):
    if args.calibrate_prompts:
      calibrated, calibration = bench_suite.calibrate_for_bench(
          ctx, *drafts(args)[0], suites, args.num_prompts, args.calibrate_prompts,
          args.calibrate_max_new_tokens or args.max_new_tokens, args.calibration_source)
      print(f"calibrated ASD preset (frozen): budget = gate = {calibrated.budget:.4g}, "
            f"max_exceptions {calibrated.max_exceptions}, normalize_q "
            f"{calibrated.normalize_q} ({calibration['rounds']} rounds)", file=sys.stderr)
    if args.assisted:
      from asd_jax.bench_assisted import transformers_assisted_greedy
      assisted = transformers_assisted_greedy(_first_standalone(args))
      runners["assisted"] = assisted
    extra = spec_runners(args, calibrated)
    runners.update(extra)
    rows = rows + (("assisted",) if args.assisted else ()) + tuple(extra)

  prepared = [runners[name](ctx) for name in rows]
  results = run_rows(ctx, prepared)
  table_rows = bench_report.row_dicts(results)
  config = config_dict(args, suites, tuple(r["name"] for r in table_rows))
  config["prompt_ids"] = {s: [p.prompt_id for p in prompts if p.suite == s] for s in suites}
  config["prompt_tokens"] = [len(ids) for _, ids in encoded]
  if calibration is not None:
    config["asd_calibration"] = calibration

  def save(stage: str) -> None:
    """Writes the JSON so far (a long suite run keeps what it measured if a later stage dies)."""
    if args.json:
      config["stage"] = stage
      config.setdefault("memory_maps", {})[stage] = compiled_programs.memory_map_count()
      bench_report.write_json(args.json, bench_report.machine_info(load_at_start), config,
                              table_rows)

  save("speed")
  triples = []
  if args.protocol:
    print(bench_report.format_table(table_rows), file=sys.stderr)
    triples = bench_suite.run_protocols(ctx, prepared, table_rows, args.drift_tol,
                                        args.protocol_schedule)
    config["protocol"] = triples
    save("protocol")
  if args.mode in ("spec", "suite"):
    prompt_ids = [(p.suite, p.prompt_id) for p in prompts]
    prompts_ids = [ids for _, ids in encoded]
    # With --natural-eos the timed outputs are the natural-EOS outputs, so their quality
    # columns, HumanEval pass@1 included, are read from them rather than from a rerun.
    timed = bench_suite.quality_columns(ctx, table_rows, results, prompt_ids, prompts_ids,
                                        pass_at_1=not args.ignore_eos)
    fixed, natural = (timed, {}) if args.ignore_eos else ({}, timed)
    if args.quality:
      ours = quality_rows or [r.name for r in results if not _other_engine(r.name)]
      natural = bench_suite.natural_eos_quality(ctx, runners, ours,
                                                args.quality_max_new_tokens, prompt_ids,
                                                prompts_ids)
    for row in table_rows:
      q = natural.get(row["name"]) or fixed.get(row["name"]) or {}
      row["nll"], row["differs_from_strict"] = q.get("nll"), q.get("differs_from_strict")
      row["pass_at_1"] = q.get("pass_at_1")
      if args.ignore_eos:
        row["quality_fixed_workload"] = fixed.get(row["name"])
      if row["name"] in natural:
        row["quality_natural_eos"] = natural[row["name"]]
  print(f"{args.target} | mode {args.mode} | {', '.join(suites)} x {args.num_prompts} prompts | "
        f"max_new_tokens {args.max_new_tokens} | "
        f"{'EOS ignored' if args.ignore_eos else 'natural EOS'} | batch {args.batch_size} | "
        f"repeats {args.repeats}")
  print(bench_report.format_table(table_rows))
  for lines in (bench_report.format_protocol_gains(triples),
                bench_report.format_paired_quality(table_rows)):
    if lines:
      print(lines)
  load = bench_report.load_average()
  if load is not None and load > (os.cpu_count() or 1):
    print(f"note: 1-minute load average {load} > {os.cpu_count()} cores: other processes "
          "competed for the CPU, so these throughputs are pessimistic", file=sys.stderr)
  if args.json:
    save("done")
    print(f"wrote {args.json}")


if __name__ == "__main__":
  main()
