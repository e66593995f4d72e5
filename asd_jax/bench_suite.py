"""The benchmark suite around the speed rows: calibrated ASD, budget sweep, the paper's
strict -> ASD -> strict protocol, quality columns, and transformers assisted generation.

Order of a run (`python -m asd_jax.bench --mode suite`):
1. calibration (before any timed row): the q25 recipe on the last --calibrate-prompts prompts of
   each suite (disjoint from the eval prompts), with the first chain drafter; the config is
   frozen into the calibrated rows and recorded in config["asd_calibration"];
2. the speed rows, taking turns batch by batch (asd_jax.bench_rows.run_rows), fixed workload;
3. the protocol triples per (drafter, chain/tree): strict, ASD paper, strict, ASD calibrated,
   strict, taking turns batch by batch (--protocol-schedule whole-pass: whole passes); gain
   and drift go into the ASD rows, raw passes into config["protocol"];
4. quality: target NLL of every row's outputs and the share differing from strict; with
   --quality, a second, natural-EOS run of our rows (--quality-max-new-tokens) that also runs
   HumanEval's tests (pass@1). The table's nll / differs / pass@1 columns come from that run.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

from asd_jax.asd_config import PAPER, ASDConfig
from asd_jax.bench_report import REFERENCE_ROW
from asd_jax.bench_rows import BenchContext, PreparedRow, RowResult, run_rows
from asd_jax.cli_common import split_list_flag


def parse_budgets(text: str | None) -> tuple[float, ...]:
  """'0,1,2.5' -> (0.0, 1.0, 2.5); empty/None -> (); negative or not a number -> ValueError."""
  if not text:
    return ()
  out = []
  for part in split_list_flag(text, "--asd-budgets"):
    try:
      b = float(part)
    except ValueError:
      raise ValueError(f"--asd-budgets: {part!r} is not a number") from None
    if not b >= 0 or b == float("inf"):
      raise ValueError(f"--asd-budgets: budgets must be finite and >= 0, got {part}")
    out.append(b)
  return tuple(dict.fromkeys(out))


def budget_preset(budget: float) -> tuple[str, ASDConfig]:
  """The sweep row preset: the paper's gate and exception cap with another budget."""
  return f"b{budget:g}", dataclasses.replace(PAPER, budget=budget)


def calibrate_for_bench(ctx: BenchContext, draft: str, k: int, suites: Sequence[str],
                        eval_count: int, count: int, max_new_tokens: int,
                        source: str = "suite-tail"):
  """(ASDConfig, record): the q25 recipe on the calibration split, with chain drafter `draft`."""
  import jax

  from asd_jax.bench_calibration import calibrate_on_prompts, calibration_prompts
  from asd_jax.cli_common import right_pad
  from asd_jax.plain_decode import plain_decode
  from models.drafter_setup import setup_drafter
  from models.tokenizer import encode_chat

  t0 = time.perf_counter()
  prompts = calibration_prompts(suites, eval_count, count, source)
  _, _, loaded = ctx.jax_target
  key = (draft, k, None, None)
  if key not in ctx.drafter_setups:
    ctx.drafter_setups[key] = setup_drafter(draft, loaded, k=k, target_name=ctx.target)
  setup = ctx.drafter_setups[key]
  if setup.engine != "chain":
    raise ValueError(f"calibration needs a chain drafter (a standalone LM); {draft!r} is "
                     f"{setup.kind}")
  encoded = [encode_chat(ctx.tokenizer, p.text) for p in prompts]
  fns, params, _ = ctx.jax_target
  answers = []
  for ids in encoded:
    prompt, lengths = right_pad([ids], bucket=64)
    out = plain_decode(fns, params, prompt, lengths, max_new_tokens=max_new_tokens)
    answers.append(jax.device_get(out.tokens_BxN)[0].tolist())
  cfg, record = calibrate_on_prompts(setup.target_fns, setup.target_params, setup.drafter,
                                     setup.params, encoded, answers)
  record.update({"draft": draft, "k": k, "quantile": 0.25, "max_new_tokens": max_new_tokens,
                 "source": source,
                 "prompt_ids": {s: [p.prompt_id for p in prompts if p.suite == s]
                                for s in dict.fromkeys(p.suite for p in prompts)},
                 "seconds": round(time.perf_counter() - t0, 1)})
  return cfg, record


def strict_name_for(row: dict) -> str | None:
  """The strict row of the same drafter and shape as an ASD row (None for other rows)."""
  if row.get("rule") != "asd":
    return None
  preset = row["asd_config"]["preset"]
  return row["name"][:-len(f"asd_{preset}")] + "strict"


def protocol_groups(table_rows: Sequence[dict]) -> list[tuple[str, list[str]]]:
  """(strict row, [ASD paper, ASD calibrated rows]) per drafter and shape, in table order."""
  names = {r["name"] for r in table_rows}
  groups: dict[str, list[str]] = {}
  for row in table_rows:
    strict = strict_name_for(row)
    if strict in names and row["asd_config"]["preset"] in ("paper", "calibrated"):
      groups.setdefault(strict, []).append(row["name"])
  return list(groups.items())


def run_protocols(ctx: BenchContext, prepared: Sequence[PreparedRow], table_rows: list[dict],
                  drift_tol: float, schedule: str) -> list[dict]:
  """Runs the protocol for every group; writes gain/drift into the ASD rows; returns triples."""
  from asd_jax.bench_protocol import run_protocol
  by_name = {p.name: p for p in prepared}
  rows = {r["name"]: r for r in table_rows}
  triples = []
  for strict, asd_names in protocol_groups(table_rows):
    for t in run_protocol(ctx, by_name[strict], [by_name[n] for n in asd_names], drift_tol,
                          progress=ctx.progress, schedule=schedule):
      rows[t["asd_row"]]["gain_vs_strict"] = t["gain"]
      rows[t["asd_row"]]["drift"] = f"{t['drift']:.1%}" + ("!" if t["drift_flag"] else "")
      rows[t["asd_row"]]["protocol"] = {k: v for k, v in t.items() if k != "passes"}
      triples.append(t)
  return triples


def quality_columns(ctx: BenchContext, table_rows: Sequence[dict],
                    results: Sequence[RowResult], prompt_ids: Sequence[tuple[str, str]],
                    prompts_ids: Sequence[Sequence[int]], pass_at_1: bool) -> dict[str, dict]:
  """Per row name: nll, differs_from_strict and (with pass_at_1) HumanEval pass@1."""
  from asd_jax.bench_quality import (differs_share, humaneval_pass_at_1, mcnemar_exact,
                                     output_nll)
  fns, params, _ = ctx.jax_target
  outputs = {r.name: r.outputs for r in results}
  out: dict[str, dict] = {}
  nll_memo, check_memo = {}, {}   # rows share equal outputs (strict rows: all of plain's)
  for row in table_rows:
    name = row["name"]
    if name not in outputs:
      continue
    q: dict[str, Any] = {"mean_new_tokens": round(sum(map(len, outputs[name]))
                                                  / max(len(outputs[name]), 1), 2)}
    nll = output_nll(fns, params, prompts_ids, outputs[name], nll_memo)
    q["nll"] = None if nll["mean_nll"] is None else round(nll["mean_nll"], 5)
    q["nll_per_output"] = nll["per_output"]
    ref = strict_name_for(row)
    ref = ref if ref in outputs else REFERENCE_ROW   # strict == plain greedy decoding
    q["differs_from_strict"] = (differs_share(outputs[name], outputs[ref])
                                if ref in outputs else None)
    q["differs_reference"] = ref
    if pass_at_1:
      he = [(i, pid) for i, (suite, pid) in enumerate(prompt_ids) if suite == "humaneval"]
      if he:
        texts = [ctx.tokenizer.decode(outputs[name][i], skip_special_tokens=True) for i, _ in he]
        res = humaneval_pass_at_1([pid for _, pid in he], texts, memo=check_memo)
        q["pass_at_1"] = res["pass_at_1"]
        q["humaneval_results"] = res["results"]
    out[name] = q
  for name, q in out.items():  # paired against the reference row, once every row has results
    ref = out.get(q["differs_reference"])
    if ref is None or ref is q:
      continue
    if "humaneval_results" in q and "humaneval_results" in ref:
      q["pass_at_1_vs_reference"] = mcnemar_exact(ref["humaneval_results"],
                                                  q["humaneval_results"])
    if q["nll"] is not None and ref["nll"] is not None:
      q["nll_change_vs_reference"] = round(q["nll"] - ref["nll"], 5)
  return out


def natural_eos_quality(ctx: BenchContext, runners: dict, names: Sequence[str],
                        max_new_tokens: int, prompt_ids, prompts_ids) -> dict[str, dict]:
  """Re-runs `names` with natural EOS (one pass) and returns their quality columns.

  The timed phases are over, so their compiled programs are dropped first: a new EOS setting
  compiles every row again, and keeping both sets crossed Linux's limit on memory mappings in
  a 16-row suite (asd_jax/compiled_programs.py), where LLVM aborted the run.
  """
  from asd_jax.compiled_programs import release_compiled_programs
  from models.tokenizer import eos_token_ids
  release_compiled_programs()
  qctx = dataclasses.replace(ctx, max_new_tokens=max_new_tokens, repeats=1,
                             eos_ids=eos_token_ids(ctx.tokenizer, ctx.jax_target[2].hf_config),
                             drafter_setups=ctx.drafter_setups)
  qctx.__dict__["jax_target"] = ctx.jax_target   # share the loaded target
  prepared = [runners[n](qctx) for n in names]
  results = run_rows(qctx, prepared)
  from asd_jax import bench_report
  rows = bench_report.row_dicts(results)
  quality = quality_columns(qctx, rows, results, prompt_ids, prompts_ids, pass_at_1=True)
  for row in rows:
    quality[row["name"]].update({"tokens_per_s": row["tokens_per_s"], "tau": row["tau"],
                                 "new_tokens": row["new_tokens"]})
  return quality
