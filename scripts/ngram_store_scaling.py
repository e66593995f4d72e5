"""Does a bigger n-gram store raise tau? Replays strict decoding with stores built from the
first 1/4, 1/2 and all of the shipped store's text, and with longer own-history matches.

  python scripts/simulate_ngram_widths.py --answers out/answers_all.json   # once: the answers
  python scripts/ngram_store_scaling.py --answers out/answers_all.json --json out/scaling.json

The replay (scripts/simulate_ngram_widths.py) is exact for tau: strict decoding commits the
target's greedy answer, so the rounds follow from the answers without decoding. Store text is
the shipped store's (prompts + the target's greedy answers to offline training prompts); the
answers are the target's to MT-Bench and HumanEval, so the two never share a prompt.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # scripts.* when run as a file

from asd_jax.ngram_store import MANIFEST_FILE, STORE_FILE, build_store  # noqa: E402
from models.drafter_folder import DRAFTERS_DIR  # noqa: E402
from scripts.simulate_ngram_widths import StoreLookup, engine_rule, replay  # noqa: E402


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--answers", required=True, help="answers JSON of simulate_ngram_widths.py")
  p.add_argument("--store", default=str(DRAFTERS_DIR / "smollm2-135m-ngram-store"))
  p.add_argument("--k", type=int, default=5)
  p.add_argument("--own-max-n", default="3,5,8", help="own-history n-gram lengths to try "
                 "(the engine's ngram+store default is 3)")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  if args.k <= 0:
    p.error(f"--k must be positive, got {args.k}")
  answers = json.loads(Path(args.answers).read_text())
  manifest = json.loads((Path(args.store) / MANIFEST_FILE).read_text())
  with np.load(Path(args.store) / STORE_FILE) as data:
    text = np.split(data["tokens"].astype(np.int64), np.cumsum(data["lengths"])[:-1])
  # Unit cost per verified width is not measured here: tau is what the store decides.
  cost = {w: 1.0 for w in range(args.k + 1)}
  suites = sorted({a["suite"] for a in answers})
  results = []
  print(f"{'store text':>12} {'own max n':>9} " + " ".join(f"{s + ' tau':>14}" for s in suites))
  for share in (4, 2, 1):
    seqs = text[:len(text) // share]
    store = StoreLookup(build_store(seqs, manifest["vocab_size"], manifest["min_n"],
                                    manifest["max_n"]))
    for own in [int(n) for n in args.own_max_n.split(",")] if share == 1 else [3]:
      row = {"store_tokens": int(sum(map(len, seqs))), "own_max_n": own}
      for suite in suites:
        pairs = [(a["prompt"], a["output"]) for a in answers if a["suite"] == suite]
        row[suite] = round(replay(pairs, store, args.k, engine_rule, cost, max_n=own)["tau"], 4)
      results.append(row)
      print(f"{row['store_tokens']:>12} {own:>9} " + " ".join(f"{row[s]:>14.3f}" for s in suites))
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"k": args.k, "rows": results}, indent=1) + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
