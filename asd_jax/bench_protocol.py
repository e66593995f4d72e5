"""The paper's fixed-workload protocol for "ASD gain vs strict" (specs/asd.md).

Strict, then ASD, then strict again, over the same batches with the same drafter and K; the
gain is ASD throughput / mean of the two strict throughputs (`wall_gain`: mean strict pass
time / ASD pass time - 1, the gain per whole answer), and a triple whose two strict passes
differ by more than `drift_tol` (paper: 3%) is flagged (the paper discards it; here it stays in
the JSON with `drift_flag` set). Several ASD presets share the strict passes between them:
S A1 S A2 S, triple i = (S_i, A_i, S_i+1).

Two schedules run that order:
- "whole-pass" (the paper's literal reading): each pass decodes every batch before the next
  pass starts, so one triple spans minutes.
- "interleaved" (default): the order S A1 S A2 S runs batch by batch, and each pass's time is
  summed over the batches. Every pass still decodes the same work in the same order relative
  to the others, but the passes see the same background load. On a shared VM whole passes of
  identical work drifted 5-12% apart (README, the AMD suite run); interleaved, 0.1-1.2% for
  the same drafters.
Interleaving removes slow drift, not the noise of single calls (9% CV back to back on that
VM): over P prompts that noise alone sets the drift's sd at sqrt(2/P) * CV (`chance_drift`;
scripts/timing_noise.py measures the CV). So each pass keeps its per-batch wall times
(`batch_wall_s`), and each triple gets a bootstrap interval of its gain over them.
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from asd_jax.bench_rows import BenchContext, PreparedRow

DRIFT_TOL = 0.03


SCHEDULES = ("interleaved", "whole-pass")   # the first is the default


def _timed_batch(row: PreparedRow, batch) -> tuple[float, int]:
  """(wall seconds, new tokens) of one call of `row` on `batch`."""
  t0 = time.perf_counter()
  out = row.run_batch(batch)
  return time.perf_counter() - t0, sum(len(o) for o in out.tokens)


def _pass_record(name: str, walls: Sequence[float], tokens: int) -> dict:
  wall = sum(walls)
  return {"row": name, "wall_s": round(wall, 4), "new_tokens": tokens,
          "tokens_per_s": round(tokens / wall, 3) if wall > 0 else 0.0,
          "batch_wall_s": [round(w, 4) for w in walls]}


def timed_pass(ctx: BenchContext, row: PreparedRow) -> dict:
  """One timed pass of `row` over ctx.batches: {'wall_s', 'new_tokens', 'tokens_per_s',
  'batch_wall_s'}."""
  walls, tokens = [], 0
  for batch in ctx.batches:
    wall, n = _timed_batch(row, batch)
    walls.append(wall)
    tokens += n
  return _pass_record(row.name, walls, tokens)


def interleaved_passes(ctx: BenchContext, order: Sequence[PreparedRow], progress=None
                       ) -> list[dict]:
  """The passes of `order`, run batch by batch: for each batch every row of `order` in turn.

  Returns one record per position of `order`, like timed_pass's (a row that appears twice,
  strict, gets one record per appearance)."""
  walls: list[list[float]] = [[] for _ in order]
  tokens = [0] * len(order)
  bar = progress(total=len(ctx.batches), desc="protocol (interleaved)") if progress else None
  for batch in ctx.batches:
    for i, row in enumerate(order):
      wall, n = _timed_batch(row, batch)
      walls[i].append(wall)
      tokens[i] += n
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  return [_pass_record(row.name, w, n) for row, w, n in zip(order, walls, tokens)]


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
          "wall_gain_ci95": wall_gain_interval(strict_before, asd, strict_after),
          "drift": round(drift, 4), "drift_tol": drift_tol, "drift_flag": drift > drift_tol}


def wall_gain_interval(strict_before: dict, asd: dict, strict_after: dict,
                       resamples: int = 2000, seed: int = 0) -> list[float] | None:
  """95% bootstrap interval of wall_gain over the batches (resampled with replacement, the
  three passes' times of a batch kept together), or None without per-batch times.

  The batches are the unit because they differ a lot in cost (prompt length, answer), and a
  triple's passes decode the same batches, so the pairing takes that spread out."""
  walls = [p.get("batch_wall_s") for p in (strict_before, asd, strict_after)]
  if any(w is None for w in walls) or len({len(w) for w in walls}) != 1 or len(walls[0]) < 2:
    return None
  import numpy as np
  s1, a, s2 = (np.asarray(w, dtype=np.float64) for w in walls)
  picks = np.random.default_rng(seed).integers(0, len(a), size=(resamples, len(a)))
  asd_wall = a[picks].sum(axis=1)
  if np.any(asd_wall <= 0):
    return None
  gains = (s1[picks].sum(axis=1) + s2[picks].sum(axis=1)) / 2 / asd_wall - 1
  low, high = np.quantile(gains, [0.025, 0.975])
  return [round(float(low), 4), round(float(high), 4)]


def run_protocol(ctx: BenchContext, strict: PreparedRow, asd_rows: Sequence[PreparedRow],
                 drift_tol: float = DRIFT_TOL, progress=None,
                 schedule: str = SCHEDULES[0]) -> list[dict]:
  """S A1 S A2 ... S over ctx.batches (`schedule`: see the module doc); one triple per ASD row.

  The rows warm up on every prompt width first: run_rows may have released their compiled
  programs (asd_jax/compiled_programs.py), and a compile inside a timed pass would count
  against whichever row met it. With the programs still there, a warm-up is a 1-token call.
  """
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown protocol schedule {schedule!r}; expected one of {SCHEDULES}")
  from asd_jax.compiled_programs import release_if_near_limit
  release_if_near_limit()
  for row in (strict, *asd_rows):
    row.warmup(ctx.batches)
  order = [strict]
  for row in asd_rows:
    order += [row, strict]
  if schedule == "interleaved":
    passes = interleaved_passes(ctx, order, progress)
  else:
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
  triples = [triple_summary(passes[2 * i], passes[2 * i + 1], passes[2 * i + 2], drift_tol)
             for i in range(len(asd_rows))]
  for t in triples:
    t["schedule"] = schedule
  return triples


def chance_drift(per_call_cv: float, batches: int, drift_tol: float = DRIFT_TOL) -> dict:
  """What per-call timing noise alone does to the drift check.

  With independent noise of coefficient of variation `per_call_cv` on every call of roughly
  equal cost, a pass over `batches` calls has a relative sd of cv / sqrt(batches), and the
  difference of two strict passes (the drift) one of sqrt(2) times that. Returns that sd and
  the share of triples the check flags with no drift at all: P(|N(0, sd)| > drift_tol).
  """
  if per_call_cv < 0 or batches < 1:
    raise ValueError(f"need per_call_cv >= 0 and batches >= 1, got {per_call_cv}, {batches}")
  sd = math.sqrt(2.0 / batches) * per_call_cv
  flagged = math.erfc(drift_tol / (sd * math.sqrt(2.0))) if sd > 0 else 0.0
  return {"drift_sd": sd, "flagged_share": flagged}
