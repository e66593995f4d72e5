"""The paper's fixed-workload protocol for "ASD gain vs strict" (specs/asd.md).

Strict, then ASD, then strict again, each a whole pass over the same batches with the same
drafter and K; the gain is ASD throughput / mean of the two strict throughputs (`wall_gain`:
mean strict pass time / ASD pass time - 1, the gain per whole answer), and a triple
whose two strict passes differ by more than `drift_tol` (paper: 3%) is flagged (the paper
discards it; here it stays in the JSON with `drift_flag` set). Several ASD presets share the
strict passes between them: S A1 S A2 S, triple i = (S_i, A_i, S_i+1).
"""

from __future__ import annotations

import time
from typing import Sequence

from asd_jax.bench_rows import BenchContext, PreparedRow

DRIFT_TOL = 0.03


def timed_pass(ctx: BenchContext, row: PreparedRow) -> dict:
  """One timed pass of `row` over ctx.batches: {'wall_s', 'new_tokens', 'tokens_per_s'}."""
  wall, tokens = 0.0, 0
  for batch in ctx.batches:
    t0 = time.perf_counter()
    out = row.run_batch(batch)
    wall += time.perf_counter() - t0
    tokens += sum(len(o) for o in out.tokens)
  return {"row": row.name, "wall_s": round(wall, 4), "new_tokens": tokens,
          "tokens_per_s": round(tokens / wall, 3) if wall > 0 else 0.0}


def triple_summary(strict_before: dict, asd: dict, strict_after: dict,
                   drift_tol: float = DRIFT_TOL) -> dict:
  """Gain and drift of one strict -> ASD -> strict triple (raw passes kept)."""
  s1, s2, a = (strict_before["tokens_per_s"], strict_after["tokens_per_s"],
               asd["tokens_per_s"])
  mean = (s1 + s2) / 2
  drift = abs(s1 - s2) / mean if mean > 0 else float("inf")
  # Every pass decodes the same prompts, so the wall-clock ratio is the time a user waiting for
  # whole answers saves. It differs from the tokens/s gain when ASD changes the answers' length.
  walls = [p.get("wall_s") for p in (strict_before, asd, strict_after)]
  wall_gain = (round((walls[0] + walls[2]) / 2 / walls[1] - 1, 4)
               if None not in walls and walls[1] > 0 else None)
  return {"strict_row": strict_before["row"], "asd_row": asd["row"],
          "passes": [strict_before, asd, strict_after],
          "strict_tokens_per_s_mean": round(mean, 3),
          "gain": round(a / mean - 1, 4) if mean > 0 else None,
          "wall_gain": wall_gain,
          "drift": round(drift, 4), "drift_tol": drift_tol, "drift_flag": drift > drift_tol}


def run_protocol(ctx: BenchContext, strict: PreparedRow, asd_rows: Sequence[PreparedRow],
                 drift_tol: float = DRIFT_TOL, progress=None) -> list[dict]:
  """S A1 S A2 ... S over ctx.batches; one triple per ASD row.

  The rows warm up on every prompt width first: run_rows may have released their compiled
  programs (asd_jax/compiled_programs.py), and a compile inside a timed pass would count
  against whichever row met it. With the programs still there, a warm-up is a 1-token call.
  """
  from asd_jax.compiled_programs import release_if_near_limit
  release_if_near_limit()
  for row in (strict, *asd_rows):
    row.warmup(ctx.batches)
  order = [strict]
  for row in asd_rows:
    order += [row, strict]
  bar = progress(total=len(order), desc="protocol") if progress else None
  passes = []
  for row in order:
    if bar is not None:
      bar.set_description(f"protocol {row.name}")
    passes.append(timed_pass(ctx, row))
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  return [triple_summary(passes[2 * i], passes[2 * i + 1], passes[2 * i + 2], drift_tol)
          for i in range(len(asd_rows))]
