"""The paper's motivating measurement, logged at every evaluation for any EAGLE-3 objective.

At held-out context positions (fixed sample), the drafter grows the same dynamic tree as the
VSD E-step (S paths, depth d, top-k expansion, global re-rank; vsd_jax/draft_paths.py) and its
greedy chain (argmax at every depth, the path token-level training makes likely). Against the
target's greedy continuation (the held-out data):

  greedy_pruned_rate       share of positions whose greedy chain is not one of the tree's S
                           paths (the re-rank pruned it);
  accepted_is_greedy_rate  among positions where the tree gets >= 1 token accepted, the share
                           whose accepted path is the greedy chain's prefix (the greedy chain
                           gets at least as many tokens accepted as the best tree path);
  tree_tau / greedy_tau    mean over positions of (best accepted length + 1), i.e. one
                           verification round's tokens from this position, tree and chain.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import jax
import jax.numpy as jnp

from vsd_jax.draft_paths import oracle_tokens, rollout, sample_positions
from vsd_jax.vsd_paths import accepted_length

if TYPE_CHECKING:
  from vsd_jax.eagle3_ttt import Eagle3Training

def tree_diagnostics_fn(cfg, e3: "Eagle3Training") -> Callable | None:
  """diagnostics(trainable, frozen, batch) -> dict of int/float counts (sum over batches and
  pass to `diagnostic_rates`); None when cfg.diag_positions == 0."""
  if cfg.diag_positions <= 0:
    return None
  s, d, k, n_pos = cfg.vsd_paths, cfg.vsd_depth, cfg.vsd_top_k, cfg.diag_positions

  def diagnostics(trainable, frozen, batch):
    t = batch["tokens"].shape[1]
    extra = (d - 1) * n_pos * (s + 1)
    logits, hidden0, cache, _, model = e3.forward(trainable, frozen, batch, steps=1,
                                                  extra_slots=extra)
    rows, ok = sample_positions(jax.random.key(0), batch["loss_mask"], min(n_pos, t))
    common = dict(context_len=t, logits0_BxTxVd=logits[0], hidden0_BxTxD=hidden0,
                  rows_BxP=rows, depth=d, top_k=k, key=jax.random.key(1))
    tree = rollout(model, cache, first_free_slot=t, num_paths=s, proposal="tree", **common)
    greedy = rollout(model, cache, first_free_slot=t + (d - 1) * n_pos * s, num_paths=1,
                     proposal="greedy", **common)
    oracle = oracle_tokens(batch["tokens"], batch["loss_mask"], frozen["t2d_index"], rows, d)
    tree_len = jnp.where(tree.valid, accepted_length(tree.tokens, oracle), 0).max(-1)
    greedy_len = accepted_length(greedy.tokens, oracle)[..., 0]
    in_tree = ((tree.tokens == greedy.tokens).all(-1) & tree.valid).any(-1)
    accepting = ok & (tree_len > 0)
    return {"positions": ok.sum(), "greedy_pruned": (ok & ~in_tree).sum(),
            "accepting": accepting.sum(),
            "accepted_is_greedy": (accepting & (greedy_len >= tree_len)).sum(),
            "tree_accepted": jnp.where(ok, tree_len, 0).sum(),
            "greedy_accepted": jnp.where(ok, greedy_len, 0).sum()}

  return diagnostics


def diagnostic_rates(totals: dict) -> dict:
  """JSON-ready rates from summed `diagnostics` counts."""
  n = max(int(totals["positions"]), 1)
  return {"positions": int(totals["positions"]),
          "greedy_pruned_rate": float(totals["greedy_pruned"]) / n,
          "accepted_is_greedy_rate": (float(totals["accepted_is_greedy"])
                                      / max(int(totals["accepting"]), 1)),
          "tree_tau": 1.0 + float(totals["tree_accepted"]) / n,
          "greedy_tau": 1.0 + float(totals["greedy_accepted"]) / n}
