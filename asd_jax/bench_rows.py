"""Benchmark rows: the timing harness and the row runners built on our decode engines.

A row runner takes the `BenchContext` (target, tokenizer, encoded prompts, settings), loads what
it needs and returns a `PreparedRow` (a warm-up and a per-batch call); `asd_jax.bench` lists the
runners of each mode, so a new decoding method is one more runner. `run_rows` fixes what is
timed for every row alike: warm-up first (compile excluded), then `repeats` passes over the same
batches, each call timed from host inputs to host outputs (prefill included). It goes one
padded prompt width at a time, so that a long run can drop the programs of the widths it is
done with (asd_jax/compiled_programs.py).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, Sequence

import numpy as np

# Prompt widths round up to a multiple of this, so few programs are compiled. An accelerator,
# where padding a prefill costs next to nothing and a compile costs seconds, wants a wider one
# (`--prompt-bucket`).
PROMPT_BUCKET = 64


@dataclasses.dataclass(frozen=True)
class Batch:
  """Up to batch_size prompts of one suite, in suite order."""
  suite: str
  rows: tuple[tuple[int, ...], ...]


@dataclasses.dataclass
class BenchContext:
  """What every runner sees. `eos_ids` is empty when EOS is ignored (fixed workload)."""
  target: str
  tokenizer: Any
  batches: list[Batch]
  max_new_tokens: int
  eos_ids: tuple[int, ...]
  batch_size: int
  repeats: int
  progress: Callable[..., Any] | None = None   # tqdm-like factory(total=, desc=)
  weight_blocks: bool = True                    # load_decoder(weight_blocks=...)
  prompt_bucket: int = PROMPT_BUCKET            # padded prompt widths are multiples of this
  # Drafter setups by (draft, k, tree, kind), shared by the rows of one drafter so that they
  # share compiled programs (a budget sweep compiles once) and parameter buffers.
  drafter_setups: dict = dataclasses.field(default_factory=dict)

  @functools.cached_property
  def jax_target(self):
    """(fns, params, loaded) of the JAX target, loaded once and shared by our runners."""
    from models.load import load_decoder
    from models.lm_fns import decoder_fns
    loaded = load_decoder(self.target, weight_blocks=self.weight_blocks)
    fns, params = decoder_fns(loaded.model, name=self.target)
    return fns, params, loaded


@dataclasses.dataclass
class BatchOutput:
  """What one timed call returns: generated ids per prompt of the batch, and for speculative
  rows the verification rounds and the tokens they committed (tau = round_tokens / rounds)."""
  tokens: list[list[int]]
  rounds: int = 0
  round_tokens: int = 0
  accepted_per_position: tuple[int, ...] = ()  # rounds that accepted >= j+1 draft tokens


RunBatch = Callable[[Batch], BatchOutput]


@dataclasses.dataclass
class PreparedRow:
  """A loaded, ready row: `warmup(batches)` compiles what those batches need (untimed; called
  once per prompt-width group, so rows of other engines warm up on the first call only:
  `first_call_only`); `run_batch` is the timed call."""
  name: str
  run_batch: RunBatch
  warmup: Callable[[Sequence[Batch]], None]
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)


RowRunner = Callable[[BenchContext], PreparedRow]


@dataclasses.dataclass
class RowResult:
  """Raw measurements of one row; bench_report derives tokens/s, speedup and match_share.

  outputs: generated ids per prompt (batches flattened, from the last timed pass).
  wall_s / new_tokens: summed over all timed passes; per_suite the same per suite.
  tau: round_tokens / rounds over all calls, 1.0 for rows without rounds (plain decoding).
  rounds / accepted_per_position: verification rounds, and how many of them accepted at least
  j+1 draft tokens (j = block position or tree depth), summed over all timed passes.
  """
  name: str
  outputs: list[list[int]]
  wall_s: float
  new_tokens: int
  prompts: int
  tau: float
  per_suite: dict[str, dict[str, float]]
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)
  rounds: int = 0
  accepted_per_position: tuple[int, ...] = ()


def _add_counts(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
  n = max(len(a), len(b))
  return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n))


def first_call_only(warmup: Callable[[], None]) -> Callable[[Sequence[Batch]], None]:
  """A PreparedRow warm-up for rows without per-width compiled programs (other engines):
  runs `warmup()` on the first call and does nothing on later prompt-width groups."""
  done = []

  def warm(batches: Sequence[Batch]) -> None:
    del batches
    if not done:
      warmup()
      done.append(True)

  return warm


def padded_width(batch: Batch, bucket: int = PROMPT_BUCKET) -> int:
  """The prompt width `padded_batch` gives this batch: one compiled program per width."""
  from asd_jax.cli_common import bucketed_width
  return bucketed_width(max(len(r) for r in batch.rows), bucket)


def width_groups(batches: Sequence[Batch], bucket: int = PROMPT_BUCKET) -> list[list[int]]:
  """Indices of `batches` grouped by padded prompt width (widths in order of first use)."""
  groups: dict[int, list[int]] = {}
  for i, batch in enumerate(batches):
    groups.setdefault(padded_width(batch, bucket), []).append(i)
  return list(groups.values())


def run_rows(ctx: BenchContext, rows: Sequence[PreparedRow]) -> list[RowResult]:
  """Times `repeats` passes over ctx.batches, one padded prompt width at a time: every row
  warms up on the width's batches, then the rows take turns batch by batch.

  Taking turns means a load change on a shared machine hits all rows alike instead of
  whichever row happened to run during it. Going width by width lets a long run release the
  compiled programs between widths when the process nears Linux's limit on memory mappings
  (asd_jax/compiled_programs.py); every width is warmed up again before it is timed, so no
  compile is ever timed. Outputs keep ctx.batches' order.
  """
  from asd_jax.compiled_programs import release_if_near_limit
  warmup_s = {row.name: 0.0 for row in rows}
  acc = {row.name: dict(outputs={}, wall_s=0.0, new_tokens=0, rounds=0, round_tokens=0,
                        per_position=(), per_suite={}) for row in rows}
  released = 0
  bar = (ctx.progress(total=ctx.repeats * len(ctx.batches) * len(rows), desc="bench")
         if ctx.progress else None)
  for g, group in enumerate(width_groups(ctx.batches, ctx.prompt_bucket)):
    if g and release_if_near_limit():
      released += 1
    for row in rows:
      t0 = time.perf_counter()
      row.warmup([ctx.batches[i] for i in group])
      warmup_s[row.name] += time.perf_counter() - t0
    for rep in range(ctx.repeats):
      for i in group:
        batch = ctx.batches[i]
        for row in rows:
          if bar is not None:
            bar.set_description(row.name)
          t0 = time.perf_counter()
          out = row.run_batch(batch)
          dt = time.perf_counter() - t0
          n = sum(len(o) for o in out.tokens)
          a = acc[row.name]
          a["wall_s"] += dt
          a["new_tokens"] += n
          a["rounds"] += out.rounds
          a["round_tokens"] += out.round_tokens
          a["per_position"] = _add_counts(a["per_position"], out.accepted_per_position)
          s = a["per_suite"].setdefault(batch.suite,
                                        {"prompts": 0, "new_tokens": 0, "wall_s": 0.0})
          s["new_tokens"] += n
          s["wall_s"] += dt
          if rep == ctx.repeats - 1:
            s["prompts"] += len(batch.rows)
            a["outputs"][i] = out.tokens
          if bar is not None:
            bar.update(1)
  if bar is not None:
    bar.close()
  results = []
  for row in rows:
    a = acc[row.name]
    for s in a["per_suite"].values():
      s["tokens_per_s"] = s["new_tokens"] / s["wall_s"] if s["wall_s"] > 0 else 0.0
    tau = a["round_tokens"] / a["rounds"] if a["rounds"] else 1.0
    outputs = [tokens for i in sorted(a["outputs"]) for tokens in a["outputs"][i]]
    results.append(RowResult(name=row.name, outputs=outputs, wall_s=a["wall_s"],
                             new_tokens=a["new_tokens"], prompts=len(outputs), tau=tau,
                             per_suite=a["per_suite"],
                             extra={"warmup_s": round(warmup_s[row.name], 2),
                                    "compiled_programs_released": released, **row.extra},
                             rounds=a["rounds"], accepted_per_position=a["per_position"]))
  return results


def make_batches(prompts: Sequence[tuple[str, Sequence[int]]], batch_size: int) -> list[Batch]:
  """Groups (suite, ids) into batches of up to batch_size, never mixing suites."""
  batches: list[Batch] = []
  for suite, ids in prompts:
    if batches and batches[-1].suite == suite and len(batches[-1].rows) < batch_size:
      last = batches[-1]
      batches[-1] = Batch(suite, last.rows + (tuple(ids),))
    else:
      batches.append(Batch(suite, (tuple(ids),)))
  return batches


def padded_batch(ctx: BenchContext, batch: Batch, max_new: int):
  """(prompt_BxT, lengths_B, max_new_B): right-padded to ctx.prompt_bucket and filled up to
  batch_size with dummy rows that generate nothing, so each prompt width compiles once."""
  from asd_jax.cli_common import right_pad
  rows = list(batch.rows)
  filler = ctx.batch_size - len(rows)
  prompt, lengths = right_pad(rows + [rows[-1]] * filler, bucket=ctx.prompt_bucket)
  return prompt, lengths, np.array([max_new] * len(rows) + [0] * filler, np.int32)


def warmup_per_width(ctx: BenchContext, call: Callable[[Batch, int], BatchOutput]):
  """(compiled widths, warmup): warmup(batches) makes one 1-token call per distinct padded
  prompt width among `batches` (the same compiled program as the timed calls, since max_new_B
  is traced)."""

  def first_per_width(batches: Sequence[Batch]) -> dict[int, Batch]:
    widths: dict[int, Batch] = {}
    for batch in batches:
      widths.setdefault(padded_width(batch, ctx.prompt_bucket), batch)
    return widths

  def warmup(batches: Sequence[Batch]) -> None:
    for batch in first_per_width(batches).values():
      call(batch, 1)

  return sorted(first_per_width(ctx.batches)), warmup


def ours_plain_greedy(ctx: BenchContext) -> PreparedRow:
  """asd_jax.plain_decode, greedy: the baseline every speedup is measured against.

  Batches are right-padded to a width that is a multiple of ctx.prompt_bucket and filled up to
  batch_size with dummy rows that generate nothing, so each prompt width compiles one program.
  The warm-up runs each distinct program once with max_new_B = 1 (same compiled program, since
  max_new_B is a traced argument), which compiles without paying a full generation.
  """
  import jax

  from asd_jax.plain_decode import plain_decode

  fns, params, _ = ctx.jax_target
  n = ctx.max_new_tokens

  def call(batch: Batch, max_new: int):
    rows = batch.rows
    prompt, lengths, max_new_B = padded_batch(ctx, batch, max_new)
    out = plain_decode(fns, params, prompt, lengths, max_new_tokens=n, eos_ids=ctx.eos_ids,
                       max_new_B=max_new_B)
    tokens, counts, nonfinite = jax.device_get(
        (out.tokens_BxN, out.num_generated_B, out.nonfinite_B))
    if nonfinite[:len(rows)].any():
      raise ValueError("the target produced non-finite logits during the benchmark")
    return BatchOutput([tokens[b, :counts[b]].tolist() for b in range(len(rows))])

  widths, warmup = warmup_per_width(ctx, call)
  return PreparedRow("ours_plain_greedy", lambda b: call(b, n), warmup,
                     extra={"compiled_widths": widths, "backend": jax.default_backend()})
