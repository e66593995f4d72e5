"""Table of VSD-vs-baseline training runs: `python scripts/vsd_report.py WORKDIR... [--json F]`.

For each workdir (a `python -m vsd_jax.train` run), the last held-out evaluation of its
summary.json: simulated tau (chain and tree; vsd_jax/simulated_tau.py) and the tree
diagnostics (vsd_jax/vsd_diagnostics.py). Real decoding tau comes from the benchmark
(`python -m asd_jax.bench --mode spec --draft A,B --tree 4,4,16`), not from here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # asd_jax when run as a file
from asd_jax.cli_common import check_output_path  # noqa: E402


def last_eval(workdir: Path) -> dict:
  summary = json.loads((workdir / "summary.json").read_text())
  if not summary.get("evals"):
    raise ValueError(f"{workdir}/summary.json has no evaluation")
  ev = summary["evals"][-1]
  row = {"run": workdir.name, "step": ev["step"], "eval_loss": ev["loss"],
         "wall_s": summary.get("wall_seconds"), "command": summary.get("command")}
  for k, v in ev.items():
    if isinstance(v, dict) and "tau" in v:
      row[f"sim_{k}_tau"] = v["tau"]
  row.update({k: v for k, v in ev.get("diagnostics", {}).items() if k != "positions"})
  return row


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("workdirs", nargs="+", type=Path)
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if args.json:
    try:
      check_output_path(args.json, "--json")
    except ValueError as e:
      p.error(str(e))
  rows = []
  for w in args.workdirs:
    try:
      rows.append(last_eval(w))
    except (OSError, ValueError) as e:
      print(f"skipping {w}: {e}", file=sys.stderr)
  if not rows:
    print("error: no finished runs", file=sys.stderr)
    return 2
  cols = [c for c in rows[0] if c not in ("command",)]
  print("| " + " | ".join(cols) + " |")
  print("|" + "---|" * len(cols))
  for r in rows:
    print("| " + " | ".join(f"{r.get(c):.4f}" if isinstance(r.get(c), float) else str(r.get(c))
                            for c in cols) + " |")
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
