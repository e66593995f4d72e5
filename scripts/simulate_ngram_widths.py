"""How many draft tokens an n-gram round is worth verifying: a round-by-round simulation.

  python scripts/simulate_ngram_widths.py --json out/ngram_widths.json

1. Decodes the target's greedy answers (natural EOS, batched plain decoding) to the first
   --num-prompts prompts of each suite, or reads them from --answers (a JSON this script wrote).
2. Measures, in the real chain loop, what a round verifying K+1 tokens costs in plain decoding
   steps (a drafter that always proposes token 0), or takes --cost.
3. Replays the n-gram drafter (own-history lookup, then the shipped store) over each answer:
   strict verification commits the accepted prefix plus the target's token, exactly as the
   engine does, so tau and the speedup (tokens / summed round cost) follow without decoding.
   It prints, per suite, fixed K against the engine's width rule (own match: K; stored match of
   n tokens: n - 1; no match: a plain step), and the mean accepted length per match kind,
   which is where the rule comes from.

The replay is exact for tau (strict output == plain greedy); the speedup is as good as the
cost curve, which is why step 2 measures it in the loop on this machine. --measure N checks it
by real decoding: the first N answers' prompts of each suite, one request per call, plain
decoding and strict `ngram+store` at each K with and without the widths (the latter verifies
every draft at full K, as the engine did before), taking turns prompt by prompt. With
--measure-temperature T the same comparison samples (rule='sample', prompt i with seed i, EOS
ignored) and adds the control that verifies all K every round, which is what rule='sample'
did before it used the widths (2026-12-03):

  python scripts/simulate_ngram_widths.py --num-prompts 8 --ks 5 --measure 8 --measure-ks 5 \
      --measure-temperature 0.7 --max-new-tokens 128 --json out/ngram_widths_sampled.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts.* when run as a file

from asd_jax.cli_common import (  # noqa: E402
    attach_dash_values, check_output_path, check_positive_flags, run_cli, split_list_flag)


def own_lookup(hist, max_n, min_n):
  """(end j, n) of the latest earlier occurrence of the longest suffix n-gram; (-1, 0) if none.
  The plain-Python twin of asd_jax.ngram_drafter.lookup_draft."""
  for n in range(max_n, min_n - 1, -1):
    if len(hist) < n:
      continue
    suffix = hist[len(hist) - n:]
    for j in range(len(hist) - 2, n - 2, -1):
      if hist[j - n + 1:j + 1] == suffix:
        return j, n
  return -1, 0


def own_draft(hist, k, j):
  period = max(len(hist) - 1 - j, 1)
  return [hist[j + 1 + i % period] for i in range(k)]


class StoreLookup:
  """Dictionary lookups over a loaded NgramStore's tables (same continuations as store_draft)."""

  def __init__(self, store):
    self.tables = {n: {tuple(g): c.tolist() for g, c in zip(t["grams"], t["continuations"])}
                   for n, t in store.tables.items()}

  def draft(self, hist, k):
    for n in sorted(self.tables, reverse=True):
      if len(hist) >= n and (c := self.tables[n].get(tuple(hist[-n:]))) is not None:
        return [c[min(i, len(c) - 1)] for i in range(k)], n
    return None, 0


def replay(answers, store, k, width_rule, cost, max_n=3, min_n=2,
           max_new_tokens: int | None = None) -> dict:
  """Strict decoding of `answers` [(prompt, output)], round by round: rounds, committed tokens,
  accepted draft tokens (as DecodeStats counts them: committed ones only), summed cost in plain
  steps, tau, the speedup vs plain decoding, and the accepted length at full K per match kind.

  max_new_tokens stops each request there, as the engine's cap does (its last round may accept
  draft tokens past the cap, which it neither outputs nor counts)."""
  tokens = accepted = rounds = 0
  total_cost = 0.0
  by_kind = collections.defaultdict(list)
  for prompt, output in answers:
    hist, pos = list(prompt) + list(output[:1]), 1  # the prefill makes the first token
    end = len(output) if max_new_tokens is None else min(len(output), max_new_tokens)
    while pos < end:
      j, n = own_lookup(hist, max_n, min_n)
      if j >= 0:
        draft, kind = own_draft(hist, k, j), f"own {n}-gram"
      else:
        draft, n = store.draft(hist, k)
        kind = f"stored {n}-gram" if draft else None
      width = width_rule(kind, n, k) if draft else 0
      truth = output[pos:pos + k]
      full = 0
      while draft and full < len(truth) and draft[full] == truth[full]:
        full += 1
      if kind:
        by_kind[kind].append(full)
      committed = min(min(full, width) + 1, end - pos)
      accepted += min(full, width, committed)
      total_cost += cost[width]
      tokens += committed
      rounds += 1
      hist += list(output[pos:pos + committed])
      pos += committed
  return {"rounds": rounds, "tokens": tokens, "accepted": accepted, "cost": total_cost,
          "tau": tokens / max(rounds, 1), "speedup": tokens / max(total_cost, 1e-9),
          "by_kind": by_kind}


def engine_rule(kind, n, k):
  """asd_jax.ngram_drafter's draft_length: own matches verify K, a stored n-gram n - 1."""
  return k if kind.startswith("own") else max(min(n - 1, k), 0)


def full_k_rule(kind, n, k):
  """Every draft verified at K: what the engine did before draft widths."""
  return k


def full_k_drafter(drafter):
  """The n-gram drafter verifying every draft at K (the control for full_k_rule); its state's
  second entry is the per-row draft length, > 0 wherever it has a draft."""
  k = drafter.num_draft
  return dataclasses.replace(drafter, verify_widths=(),
                             draft_length=lambda state: (state[1] > 0) * k)


@functools.cache
def load_target(target):
  """(fns, params, EOS ids, tokenizer), loaded once per process for every step here."""
  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import check_tokenizer_fits, eos_token_ids, load_tokenizer
  tokenizer, loaded = load_tokenizer(target), load_decoder(target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, target)  # prompts would hold foreign ids
  fns, params = decoder_fns(loaded.model)
  return fns, params, eos_token_ids(tokenizer, loaded.hf_config), tokenizer


def decode_answers(target, suites, num_prompts, max_new_tokens, batch):
  from asd_jax.bench_prompts import load_prompts
  from asd_jax.plain_decode import plain_decode
  from models.tokenizer import encode_chat
  fns, params, eos, tokenizer = load_target(target)
  prompts = load_prompts(suites, num_prompts)
  encoded = [encode_chat(tokenizer, p.text) for p in prompts]
  order = np.argsort([len(e) for e in encoded])  # similar lengths share a batch
  out = [None] * len(encoded)
  for i in range(0, len(order), batch):
    idx = order[i:i + batch]
    width = -(-max(len(encoded[j]) for j in idx) // 64) * 64
    ids = np.zeros((len(idx), width), np.int32)
    for r, j in enumerate(idx):
      ids[r, :len(encoded[j])] = encoded[j]
    res = plain_decode(fns, params, ids, np.array([len(encoded[j]) for j in idx], np.int32),
                       max_new_tokens=max_new_tokens, eos_ids=eos)
    tokens, lengths = np.asarray(res.tokens_BxN), np.asarray(res.num_generated_B)
    for r, j in enumerate(idx):
      out[j] = {"suite": prompts[j].suite, "prompt": encoded[j],
                "output": tokens[r, :lengths[r]].tolist()}
    print(f"decoded {min(i + batch, len(order))}/{len(order)}", file=sys.stderr)
  return out


def loop_cost(target, max_k, n=96, reps=3):
  """{width: ms per round / ms per plain step} in the real loops (width 0: a plain step)."""
  from asd_jax.cli_common import time_interleaved
  from scripts.decode_loop_timing import loop_runs
  fns, params, _, _ = load_target(target)
  _, med = time_interleaved(loop_runs(fns, params, range(1, max_k + 1), new_tokens=n), reps)
  return {k: v / med[0] for k, v in med.items()}


def every_round_drafter(drafter):
  """The n-gram drafter verifying all K every round, a plain step never: what rule='sample'
  did before 2026-12-03 (the control for --measure-temperature)."""
  return dataclasses.replace(drafter, verify_widths=(), draft_length=None)


def measure(target, store, answers, ks, max_new_tokens, temperature=0.0) -> tuple[dict, dict]:
  """By real decoding, turn by turn: ({config: {tokens_per_s, tau, vs_plain, match_plain}},
  {config: (K, the replay's rule for it)}).

  temperature > 0: rule='sample' (and sampled plain decoding), prompt i with seed i, EOS
  ignored so that every configuration samples the same number of tokens; match_plain is then
  not measured and no configuration has a replay rule (the replay is greedy)."""
  import jax
  from asd_jax.ngram_drafter import ngram_drafter
  from asd_jax.plain_decode import plain_decode
  from asd_jax.sampling import SamplingConfig
  from asd_jax.spec_decode import asd_decode
  fns, params, eos, _ = load_target(target)
  sampled = temperature > 0
  sampling = SamplingConfig(temperature=temperature)
  configs, rules = {}, {}
  for k in ks:
    widths = ngram_drafter(k, fns.vocab_size, store=store)
    variants = [(f"ngram+store K={k} widths", widths, engine_rule),
                (f"ngram+store K={k} full K", full_k_drafter(widths), full_k_rule)]
    if sampled:
      variants.append((f"ngram+store K={k} every round", every_round_drafter(widths), None))
    for name, drafter, rule in variants:
      configs[name] = drafter
      if not sampled:
        rules[name] = (k, rule)
  width = -(-max(len(p) for p, _ in answers) // 64) * 64  # one program per configuration
  def run(name, prompt, seed):
    ids = np.zeros((1, width), np.int32)
    ids[0, :len(prompt)] = prompt
    lengths = np.array([len(prompt)], np.int32)
    common = dict(max_new_tokens=max_new_tokens, eos_ids=() if sampled else eos,
                  sampling=sampling, seed=seed)
    if name == "plain":
      out = plain_decode(fns, params, ids, lengths, **common)
      rounds = int(out.target_forwards_B[0]) - 1
    else:
      out = asd_decode(fns, params, configs[name], store.tables, ids, lengths,
                       rule="sample" if sampled else "strict", **common)
      rounds = int(out.stats.rounds_B[0])
    n = int(out.num_generated_B[0])
    return np.asarray(out.tokens_BxN)[0, :n].tolist(), rounds
  names = ["plain", *configs]
  for name in names:
    jax.block_until_ready(run(name, answers[0][0], 0))  # compile
  totals = {name: {"s": 0.0, "tokens": 0, "rounds": 0, "match": 0} for name in names}
  for i, (prompt, _) in enumerate(answers):
    outputs = {}
    for name in names:
      t = time.perf_counter()
      outputs[name], rounds = run(name, prompt, i)
      tot = totals[name]
      tot["s"] += time.perf_counter() - t
      tot["tokens"] += len(outputs[name])
      tot["rounds"] += rounds
      tot["match"] += outputs[name] == outputs["plain"]
    print(f"measured {i + 1}/{len(answers)}", file=sys.stderr)
  plain_tps = totals["plain"]["tokens"] / totals["plain"]["s"]
  return {name: {"tokens_per_s": t["tokens"] / t["s"], "vs_plain": t["tokens"] / t["s"] / plain_tps,
                 "tau": (t["tokens"] - len(answers)) / max(t["rounds"], 1),
                 "match_plain": None if sampled else t["match"] / len(answers)}
          for name, t in totals.items()}, rules


def parse_ks(text: str, flag: str) -> list[int]:
  """'3,5,7' -> [3, 5, 7]: draft block lengths, each a positive integer."""
  fields = split_list_flag(text, flag)
  try:
    ks = [int(k) for k in fields]
  except ValueError:
    raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
  bad = [k for k in ks if k <= 0]
  if bad:
    raise ValueError(f"{flag}: a draft length K must be a positive integer, got {bad[0]}")
  return ks


def parse_cost(text: str, max_k: int) -> dict[int, float]:
  """--cost: JSON {width: round cost / plain step}. Every width 1..max_k needs a finite cost
  > 0 (a replay may verify any of them); width 0, a plain step, defaults to 1."""
  try:
    raw = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"--cost is not valid JSON ({e}): {text!r}") from None
  if not isinstance(raw, dict):
    raise ValueError(f"--cost must be a JSON object {{width: cost}}, got {text!r}")
  cost = {}
  for w, c in raw.items():
    try:
      width, value = int(w), float(c)
    except (TypeError, ValueError):
      raise ValueError(f"--cost: {w!r}: {c!r} is not an integer width and a number") from None
    if width < 0 or not math.isfinite(value) or value <= 0:
      raise ValueError(f"--cost: {w!r}: {c!r}: widths are >= 0 and costs finite and > 0")
    cost[width] = value
  missing = [w for w in range(1, max_k + 1) if w not in cost]
  if missing:
    raise ValueError(f"--cost has no cost for width {missing[0]}; the replays at K up to "
                     f"{max_k} verify any width 1..{max_k}")
  return cost


def read_answers(path: str, suites) -> list | None:
  """The answers in --answers, or None where it does not exist yet (the run writes it)."""
  if not Path(path).is_file():
    check_output_path(path, "--answers")
    return None
  try:
    answers = json.loads(Path(path).read_text())
  except (OSError, ValueError) as e:
    raise ValueError(f"--answers {path}: cannot read it ({e})") from None
  if not isinstance(answers, list) or not all(
      isinstance(a, dict) and {"suite", "prompt", "output"} <= a.keys() for a in answers):
    raise ValueError(f"--answers {path}: not an answers file of this script (a list of "
                     "{suite, prompt, output})")
  missing = [s for s in suites if not any(a["suite"] == s for a in answers)]
  if missing:
    raise ValueError(f"--answers {path} has no answers for suite {missing[0]!r}; drop it from "
                     "--suites or write the answers to a new file")
  return answers


def check_args(args):
  """(suites, ks, measure ks, the widest K replayed, cost or None, answers or None): every flag
  checked before the target loads or anything decodes."""
  from asd_jax.bench_prompts import parse_suites
  from asd_jax.sampling import SamplingConfig
  check_positive_flags(args, "num_prompts", "max_new_tokens")
  if args.measure < 0:
    raise ValueError(f"--measure must be >= 0 (0: no real decoding), got {args.measure}")
  try:
    SamplingConfig(temperature=args.measure_temperature)
  except ValueError as e:
    raise ValueError(f"--measure-temperature: {e}") from None
  suites = parse_suites(args.suites)
  ks = parse_ks(args.ks, "--ks")
  mks = parse_ks(args.measure_ks, "--measure-ks")
  widest = max(ks + (mks if args.measure else []))
  cost = parse_cost(args.cost, widest) if args.cost else None
  if args.json:
    check_output_path(args.json, "--json")
  answers = read_answers(args.answers, suites) if args.answers else None
  return suites, ks, mks, widest, cost, answers


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--suites", default="humaneval,mt_bench")
  p.add_argument("--num-prompts", type=int, default=200, help="per suite (all of both: 200)")
  p.add_argument("--max-new-tokens", type=int, default=256)
  p.add_argument("--answers", default="", help="read (or, if missing, write) answers here")
  p.add_argument("--cost", default="", help="JSON {width: round cost / plain step}; "
                 "default: measured in the loop")
  p.add_argument("--ks", default="3,5,7")
  p.add_argument("--measure", type=int, default=0, help="also decode the first N prompts of "
                 "each suite for real (plain vs fixed K vs widths)")
  p.add_argument("--measure-ks", default="5,7")
  p.add_argument("--measure-temperature", type=float, default=0.0,
                 help="> 0: --measure samples (rule='sample', EOS ignored) at this temperature, "
                 "and adds the every-round-K control")
  p.add_argument("--json", default="")
  return p


@run_cli
def main(argv=None) -> int:
  argv = sys.argv[1:] if argv is None else list(argv)
  args = build_parser().parse_args(attach_dash_values(argv, ("--ks", "--measure-ks")))
  suites, ks, mks, widest, cost, answers = check_args(args)
  from models.drafter_setup import ngram_store_for
  if answers is None:
    answers = decode_answers(args.target, suites, args.num_prompts, args.max_new_tokens, 16)
    if args.answers:
      Path(args.answers).parent.mkdir(parents=True, exist_ok=True)
      Path(args.answers).write_text(json.dumps(answers))
  if cost is None:
    cost = loop_cost(args.target, widest)
  cost[0] = cost.get(0, 1.0) * 1.02  # a skipped round: a plain step inside lax.cond (profiled)
  ngram_store = ngram_store_for(args.target, load_target(args.target)[0].vocab_size)
  store = StoreLookup(ngram_store)
  print("round cost / plain step by verified width:",
        " ".join(f"{w}:{c:.2f}" for w, c in sorted(cost.items())))
  results = {"cost": cost, "suites": {}}
  for suite in suites:
    pairs = [(a["prompt"], a["output"]) for a in answers if a["suite"] == suite]
    res = results["suites"][suite] = {}
    print(f"\n{suite} ({len(pairs)} answers)\n{'K':>3} {'fixed tau':>10} {'x plain':>8} "
          f"{'widths tau':>11} {'x plain':>8}")
    for k in ks:
      fixed = replay(pairs, store, k, full_k_rule, cost)
      rule = replay(pairs, store, k, engine_rule, cost)
      res[k] = {name: {key: r[key] for key in ("tau", "speedup", "rounds", "tokens")}
                for name, r in (("fixed", fixed), ("widths", rule))}
      res[k]["mean_accepted_at_K"] = {kind: float(np.mean(v))
                                      for kind, v in fixed["by_kind"].items()}
      print(f"{k:>3} {fixed['tau']:10.3f} {fixed['speedup']:8.3f} {rule['tau']:11.3f} "
            f"{rule['speedup']:8.3f}")
    print("mean tokens accepted per round at K={}: ".format(ks[-1]) + ", ".join(
        f"{kind} {v:.2f}" for kind, v in sorted(res[ks[-1]]["mean_accepted_at_K"].items())))
  if args.measure:
    for suite in suites:
      pairs = [(a["prompt"], a["output"]) for a in answers if a["suite"] == suite][:args.measure]
      got, rules = measure(args.target, ngram_store, pairs, mks, args.max_new_tokens,
                           args.measure_temperature)
      print(f"\n{suite}: real decoding of {len(pairs)} prompts (simulated on the same answers)")
      print(f"{'configuration':<32} {'tok/s':>7} {'tau':>6} {'x plain':>8} {'sim x plain':>12} "
            f"{'= plain':>8}")
      for name, r in got.items():
        sim = ""
        if name in rules:
          k, rule = rules[name]
          r["simulated_vs_plain"] = replay(pairs, store, k, rule, cost,
                                           max_new_tokens=args.max_new_tokens)["speedup"]
          sim = f"{r['simulated_vs_plain']:.3f}"
        match = "-" if r["match_plain"] is None else f"{r['match_plain']:.0%}"
        print(f"{name:<32} {r['tokens_per_s']:7.1f} {r['tau']:6.2f} {r['vs_plain']:8.3f} "
              f"{sim:>12} {match:>8}")
      results["suites"][suite]["measured"] = got
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
