"""Plots of a `python -m asd_jax.bench` JSON (PNG, matplotlib's Agg backend).

  python -m asd_jax.bench_plots out/suite.json --out docs/bench

Writes:
- asd_speed_quality.png: the ASD rows (budget sweep, paper and calibrated presets) of each
  drafter/shape, speedup vs our plain decoding against the mean target NLL of the outputs and
  the share of outputs that differ from strict (natural-EOS run when there is one);
- acceptance_per_position.png: per drafter and shape, the share of verification rounds that
  accepted at least j draft tokens (strict rows, and ASD paper rows dashed);
- tau_histogram.png: the distribution of (accepted drafts + 1) per round of the strict and ASD
  rows; its mean is tau, except that an answer whose last round ended on a draft adds 1 / rounds
  (that round's own token was not output, and tau does not count it).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Sequence

from asd_jax.cli_common import check_output_path

FILES = ("asd_speed_quality.png", "acceptance_per_position.png", "tau_histogram.png")


def _group(row: dict) -> str:
  """'<draft>_<shape>' of a speculative row (its name without the rule suffix)."""
  return re.sub(r"_(strict|asd_.*)$", "", row["name"])


def _label(row: dict) -> str:
  preset = row.get("asd_config", {}).get("preset", "")
  return f"B={row['asd_config']['budget']:.3g}" if preset.startswith("b") else preset


def _quality(row: dict, key: str):
  for source in ("quality_natural_eos", "quality_fixed_workload"):
    q = row.get(source) or {}
    if q.get(key) is not None:
      return q[key]
  return row.get(key)


def plot_speed_quality(rows: Sequence[dict], path: Path, title: str) -> None:
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  groups: dict[str, list[dict]] = {}
  for row in rows:
    if row.get("rule") in ("asd", "strict"):
      groups.setdefault(_group(row), []).append(row)
  for (group, members), marker in zip(sorted(groups.items()), "osD^v<>"):
    for ax, key, ylabel in ((axes[0], "nll", "mean target NLL of the outputs"),
                            (axes[1], "differs_from_strict", "share of outputs != strict")):
      sweep = sorted((r for r in members if r.get("asd_config", {}).get("preset", "")
                      .startswith("b")), key=lambda r: r["asd_config"]["budget"])
      pts = [(r["speedup_vs_plain"], _quality(r, key)) for r in sweep]
      pts = [p for p in pts if None not in p]
      if pts:
        ax.plot(*zip(*pts), "-", marker=marker, label=f"{group} budget sweep")
        for r, (x, y) in zip(sweep, pts):
          ax.annotate(_label(r), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
      for r in members:
        if r in sweep or r.get("speedup_vs_plain") is None or _quality(r, key) is None:
          continue
        name = r["rule"] if r["rule"] == "strict" else _label(r)
        ax.plot(r["speedup_vs_plain"], _quality(r, key), marker, mfc="none", ms=9,
                label=f"{group} {name}")
      ax.set_xlabel("speedup vs our plain decoding (fixed workload)")
      ax.set_ylabel(ylabel)
      ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7)
  fig.suptitle(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_acceptance(rows: Sequence[dict], path: Path, title: str) -> None:
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  for row in rows:
    preset = row.get("asd_config", {}).get("preset")
    if row.get("accepted_per_position") and (row.get("rule") == "strict" or preset == "paper"):
      shares = row["accepted_per_position"]
      ax.plot(range(1, len(shares) + 1), shares, "--" if preset else "-o",
              label=_group(row) + (" ASD paper" if preset else " strict"))
  ax.set_xlabel("draft position j (tree: depth)")
  ax.set_ylabel("share of rounds accepting >= j tokens")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_tau_histogram(rows: Sequence[dict], path: Path, title: str) -> None:
  import matplotlib.pyplot as plt
  chosen = [r for r in rows if r.get("accepted_hist") and (
      r.get("rule") == "strict" or r.get("asd_config", {}).get("preset") in ("paper",
                                                                           "calibrated"))]
  fig, ax = plt.subplots(figsize=(6.5, 4.2))
  width = 0.8 / max(len(chosen), 1)
  for i, row in enumerate(chosen):
    hist = row["accepted_hist"]
    total = max(sum(hist), 1)
    xs = [j + 1 + (i - (len(chosen) - 1) / 2) * width for j in range(len(hist))]
    ax.bar(xs, [h / total for h in hist], width,
           label=f"{row['name']} (tau {row['tau']:.2f})")
  ax.set_xlabel("accepted drafts + 1 per verification round")
  ax.set_ylabel("share of rounds")
  ax.grid(alpha=0.3, axis="y")
  ax.legend(fontsize=7)
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_report(report: dict, out_dir: str | Path) -> list[Path]:
  """Writes the three PNGs of FILES into out_dir; returns their paths."""
  import matplotlib
  matplotlib.use("Agg")
  out = Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  cfg, machine = report.get("config", {}), report.get("machine", {})
  title = (f"{cfg.get('target')} | {', '.join(cfg.get('suites', []))} x "
           f"{cfg.get('num_prompts')} | {cfg.get('max_new_tokens')} new tokens | "
           f"{machine.get('cores')} cores, {machine.get('jax_backend')}")
  rows = report["rows"]
  paths = [out / f for f in FILES]
  plot_speed_quality(rows, paths[0], title)
  plot_acceptance(rows, paths[1], title)
  plot_tau_histogram(rows, paths[2], title)
  return paths


def main(argv=None) -> None:
  p = argparse.ArgumentParser(prog="python -m asd_jax.bench_plots", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("json", help="a JSON file written by python -m asd_jax.bench --json")
  p.add_argument("--out", default="docs/bench", help="output folder (default docs/bench)")
  args = p.parse_args(argv)
  try:
    report = json.loads(Path(args.json).read_text(encoding="utf-8"))
  except (OSError, ValueError) as e:
    p.error(f"{args.json}: cannot read it as JSON ({e})")
  if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
    p.error(f"{args.json}: not a report of python -m asd_jax.bench --json (no list of rows)")
  try:
    check_output_path(args.out, "--out", folder=True)
  except ValueError as e:
    p.error(str(e))
  for path in plot_report(report, args.out):
    print(f"wrote {path}")


if __name__ == "__main__":
  main()
