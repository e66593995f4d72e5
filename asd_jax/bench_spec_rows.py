"""Benchmark rows for speculative decoding: one runner per (drafter, chain/tree, rule).

Same harness as the plain row (asd_jax/bench_rows.py): prompts right-padded to multiples of
ctx.prompt_bucket (`--prompt-bucket`), batches filled with dummy rows that generate nothing,
one untimed warm-up per compiled prompt width. tau = committed tokens / verification rounds
over the whole run.
"""

from __future__ import annotations


from asd_jax.asd_config import PAPER, ASDConfig
from asd_jax.bench_rows import (Batch, BatchOutput, BenchContext, PreparedRow, padded_batch,
                                warmup_per_width)
from asd_jax.draft_tree import TreeShape


def row_name(draft: str, tree: TreeShape | None, k: int, rule: str, preset: str) -> str:
  shape = f"tree{tree.depth}x{tree.top_k}x{tree.num_nodes}" if tree else f"chain_k{k}"
  label = rule if rule != "asd" else f"asd_{preset}"
  return f"{draft}_{shape}_{label}"


def spec_row(draft: str, *, k: int, tree: TreeShape | None, rule: str,
             asd_config: ASDConfig = PAPER, preset: str = "paper", kind: str | None = None):
  """A RowRunner for speculative decoding with `draft` (name, folder, or 'self')."""

  def runner(ctx: BenchContext) -> PreparedRow:
    import jax

    from models.drafter_setup import setup_drafter

    _, _, loaded = ctx.jax_target
    key = (draft, k, tree, kind)
    if key not in ctx.drafter_setups:
      ctx.drafter_setups[key] = setup_drafter(draft, loaded, k=k, tree=tree, kind=kind,
                                              target_name=ctx.target)
    setup = ctx.drafter_setups[key]
    n = ctx.max_new_tokens

    def call(batch: Batch, max_new: int) -> BatchOutput:
      rows = batch.rows
      prompt, lengths, max_new_B = padded_batch(ctx, batch, max_new)
      out = setup.decode(setup.target_fns, setup.target_params, setup.drafter, setup.params,
                         prompt, lengths, max_new_tokens=n, rule=rule, asd_config=asd_config,
                         eos_ids=ctx.eos_ids, max_new_B=max_new_B)
      tokens, counts, nonfinite, rounds, round_tokens, per_position = jax.device_get(
          (out.tokens_BxN, out.num_generated_B, out.nonfinite_B, out.stats.rounds_B,
           out.stats.round_tokens_B, out.stats.accepted_per_position_BxK))
      if nonfinite[:len(rows)].any():
        raise ValueError("non-finite logits during the benchmark")
      live = slice(0, len(rows))
      return BatchOutput([tokens[b, :counts[b]].tolist() for b in range(len(rows))],
                         rounds=int(rounds[live].sum()),
                         round_tokens=int(round_tokens[live].sum()),
                         accepted_per_position=tuple(
                             int(c) for c in per_position[live].sum(axis=0)))

    _, warmup = warmup_per_width(ctx, call)
    extra = {"draft": draft, "drafter": setup.kind, "engine": setup.engine, "rule": rule,
             "k": k, "tree": None if tree is None else [tree.depth, tree.top_k, tree.num_nodes]}
    if rule == "asd":
      extra["asd_config"] = {"preset": preset, "budget": asd_config.budget,
                             "gate": asd_config.gate,
                             "max_exceptions": asd_config.max_exceptions,
                             "normalize_q": asd_config.normalize_q}
    return PreparedRow(row_name(draft, tree, k, rule, preset), lambda b: call(b, n), warmup,
                       extra=extra)

  return runner
