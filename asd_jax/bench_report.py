"""Benchmark output: derived metrics per row, the machine description, a text table and JSON.

Metric definitions are DESIGN.md's: tokens_per_s = completion tokens / wall-clock of the whole
calls (prefill included, compile excluded); speedup_vs_plain = tokens_per_s / tokens_per_s of
the reference row (ours_plain_greedy) of the same run; match_share = share of prompts whose
generated ids equal the reference row's exactly (greedy near-ties can legitimately differ).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path
from typing import Any, Sequence

from asd_jax.bench_rows import RowResult

REFERENCE_ROW = "ours_plain_greedy"
TABLE_COLUMNS = (("name", "name", "{}"), ("prompts", "prompts", "{}"),
                 ("new tokens", "new_tokens", "{}"), ("wall s", "wall_s", "{:.2f}"),
                 ("tokens/s", "tokens_per_s", "{:.1f}"), ("tau", "tau", "{:.2f}"),
                 ("speedup_vs_plain", "speedup_vs_plain", "{:.2f}x"),
                 ("match", "match_share", "{:.0%}"),
                 ("gain_vs_strict", "gain_vs_strict", "{:+.1%}"), ("drift", "drift", "{}"),
                 ("nll", "nll", "{:.3f}"), ("differs", "differs_from_strict", "{:.0%}"),
                 ("pass@1", "pass_at_1", "{:.0%}"))


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def load_average() -> float | None:
  """1-minute load average (other processes share the cores on a shared machine)."""
  try:
    return round(os.getloadavg()[0], 2)
  except OSError:
    return None


def machine_info(load_at_start: float | None = None) -> dict[str, Any]:
  """Where the numbers were measured. torch/transformers versions are None if not installed.

  load_avg_1m_start/end: the 1-minute load average when the run began and ended; well above
  `cores` means other work competed for the CPU and the throughputs are pessimistic.
  """
  import jax

  def version(module: str):
    try:
      return __import__(module).__version__
    except ImportError:
      return None

  return {
      "platform": platform.platform(),
      "cpu": _cpu_name(),
      "cores": os.cpu_count(),
      "jax_backend": jax.default_backend(),
      "jax_version": jax.__version__,
      "torch_version": version("torch"),
      "transformers_version": version("transformers"),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "load_avg_1m_start": load_at_start,
      "load_avg_1m_end": load_average(),
  }


def _same_prefix(a: Sequence[int], b: Sequence[int]) -> int:
  n = 0
  for x, y in zip(a, b):
    if x != y:
      break
    n += 1
  return n


def accepted_histogram(rounds: int, at_least: Sequence[int]) -> list[int]:
  """Rounds that accepted exactly j draft tokens, j = 0..K, from the counts of rounds that
  accepted at least j+1 (DecodeStats.accepted_per_position); tokens per round = j + 1."""
  ge = [rounds, *at_least, 0]
  return [ge[j] - ge[j + 1] for j in range(len(ge) - 1)]


def row_dicts(results: Sequence[RowResult]) -> list[dict[str, Any]]:
  """JSON-ready rows with tokens_per_s, speedup_vs_plain and match_share filled in.

  Without a reference row in the run, speedup_vs_plain and match_share are None.
  """
  ref = next((r for r in results if r.name == REFERENCE_ROW), None)
  ref_tps = ref.new_tokens / ref.wall_s if ref is not None and ref.wall_s > 0 else None
  rows = []
  for r in results:
    tps = r.new_tokens / r.wall_s if r.wall_s > 0 else 0.0
    row: dict[str, Any] = {
        "name": r.name, "prompts": r.prompts, "new_tokens": r.new_tokens,
        "wall_s": round(r.wall_s, 4), "tokens_per_s": round(tps, 3), "tau": r.tau,
        "speedup_vs_plain": round(tps / ref_tps, 4) if ref_tps else None,
        "match_share": None, "common_prefix_share": None,
    }
    if ref is not None and len(ref.outputs) == len(r.outputs):
      pairs = list(zip(r.outputs, ref.outputs))
      row["match_share"] = round(sum(a == b for a, b in pairs) / len(pairs), 4)
      row["common_prefix_share"] = round(
          sum(_same_prefix(a, b) / max(len(b), 1) for a, b in pairs) / len(pairs), 4)
      row["first_mismatch"] = [None if a == b else _same_prefix(a, b) for a, b in pairs]
    if r.name == REFERENCE_ROW:
      row["speedup_vs_plain"] = 1.0
    if r.rounds:
      row["rounds"] = r.rounds
      row["accepted_per_position"] = [round(c / r.rounds, 4) for c in r.accepted_per_position]
      row["accepted_hist"] = accepted_histogram(r.rounds, r.accepted_per_position)
    row["per_suite"] = {k: {kk: round(vv, 4) if isinstance(vv, float) else vv
                            for kk, vv in v.items()} for k, v in r.per_suite.items()}
    row.update(r.extra)
    rows.append(row)
  return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
  """A plain-text table of the main columns (missing values shown as '-')."""
  cells = [[title for title, _, _ in TABLE_COLUMNS]]
  for row in rows:
    cells.append([fmt.format(row[key]) if row.get(key) is not None else "-"
                  for _, key, fmt in TABLE_COLUMNS])
  widths = [max(len(c[i]) for c in cells) for i in range(len(TABLE_COLUMNS))]
  lines = []
  for j, line in enumerate(cells):
    lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                           for i, (c, w) in enumerate(zip(line, widths))))
    if j == 0:
      lines.append("  ".join("-" * w for w in widths))
  return "\n".join(lines)


def write_json(path: str | os.PathLike, machine: dict, config: dict, rows: list[dict]) -> None:
  """Writes {"machine", "config", "rows"}, creating the parent folder."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump({"machine": machine, "config": config, "rows": rows}, f, indent=2)
    f.write("\n")


def format_protocol_gains(triples: Sequence[dict]) -> str:
  """One line per protocol triple: the tokens/s gain and the wall-clock gain per whole pass,
  which differ when ASD changes how long the answers are."""
  lines = []
  for t in triples:
    gain = "-" if t["gain"] is None else f"{t['gain']:+.1%}"   # None: no strict tokens
    line = f"protocol {t['asd_row']} vs {t['strict_row']}: tokens/s {gain}"
    if t.get("wall_gain") is not None:
      line += f", speed per whole answer {t['wall_gain']:+.1%}"
      if t.get("wall_gain_ci95"):
        low, high = t["wall_gain_ci95"]
        line += f" (95% CI {low:+.1%} to {high:+.1%} over prompts)"
    schedule = f"{t['schedule']}, " if t.get("schedule") else ""
    line += (f" ({schedule}strict drift {t['drift']:.1%}"
             f"{', flagged' if t['drift_flag'] else ''})")
    lines.append(line)
  return "\n".join(lines)


def format_paired_quality(table_rows: Sequence[dict]) -> str:
  """One line per row whose natural-EOS quality was paired with a reference row: the pass@1
  change with its McNemar test and the NLL change (empty when there is none)."""
  by_name = {r["name"]: r for r in table_rows}
  lines = []
  for row in table_rows:
    q = row.get("quality_natural_eos") or {}
    paired, ref_name = q.get("pass_at_1_vs_reference"), q.get("differs_reference")
    ref = (by_name.get(ref_name) or {}).get("quality_natural_eos") or {}
    if paired is None or "pass_at_1" not in ref:
      continue
    line = (f"{row['name']} vs {ref_name} (natural EOS, {paired['problems']} HumanEval "
            f"problems): pass@1 {ref['pass_at_1']:.1%} -> {q['pass_at_1']:.1%} "
            f"({paired['change_points']:+.2f} points; {paired['gained']} gained, "
            f"{paired['lost']} lost; {paired['test']}: p = {paired['p_value']:.3g})")
    if q.get("nll_change_vs_reference") is not None:
      line += f"; NLL {q['nll_change_vs_reference']:+.4f} nats/token"
    if q.get("differs_from_strict") is not None:
      line += f"; {q['differs_from_strict']:.0%} of outputs differ"
    lines.append(line)
  return "\n".join(lines)
