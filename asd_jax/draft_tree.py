"""Draft trees under static shapes: EAGLE-2 style dynamic trees from any language-model drafter.

Shape notation: B rows, V vocab, k = top_k (children per expanded node), D = depth,
P = k + (D-1) k^2 candidate pool, N = num_nodes kept, W = D + 2 re-fed window, S = slots.

Dynamic tree (Li et al. 2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft
Trees"): expand the k best frontier nodes per depth, each into its k most likely children;
rank every candidate by cumulative draft log-probability and keep the best N. A child's
cumulative log-probability never exceeds its parent's and ties break towards the earlier
(shallower) candidate, so the kept set is always a tree (ancestor-closed).

Sampling trees (for lossless tree speculative sampling): every expanded node gets k children
drawn i.i.d. from the filtered draft distribution and all P candidates are kept, because
recursive rejection sampling needs each node's children to be i.i.d. draft samples; which
nodes get expanded may still depend on the draws.

Drafter cache bookkeeping: the drafter's entries are valid for committed positions <= n-2 at
the start of a round. `propose` first re-feeds the last W committed tokens at their own
positions (re-writing already-right entries is harmless), which covers the up to D+1 tokens a
round can commit and yields the root distribution; tree nodes are then written to scratch
slots >= n, so the next round's window overwrites whatever the tree left behind.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from asd_jax.drafter_api import DRAFTERS_KEPT
from asd_jax.lm_api import LanguageModelFns
from asd_jax.logit_edits import DraftLogitEdits, edit_logits
from asd_jax.request_checks import check_positive_int, check_type
from asd_jax.sampling import probabilities
from asd_jax.spec_sampling import Filters
from asd_jax.sampling_keys import categorical_rows, split_keys


@dataclasses.dataclass(frozen=True)
class TreeShape:
  """depth D, top_k k children per expanded node, num_nodes N kept (N <= k + (D-1)k^2)."""

  depth: int
  top_k: int
  num_nodes: int

  def __post_init__(self):
    # An integral float (4.0) becomes 4, so that pool_size and window stay ints (as ChainDrafter
    # does for K); NaN, None or a string is refused by name, not by int()'s own error.
    for name in ("depth", "top_k", "num_nodes"):
      object.__setattr__(self, name, check_positive_int(f"tree {name}", getattr(self, name)))
    if self.num_nodes > self.pool_size:
      raise ValueError(f"tree num_nodes={self.num_nodes} exceeds the {self.pool_size} "
                       f"candidates depth={self.depth}, top_k={self.top_k} can produce")

  @property
  def pool_size(self) -> int:
    return self.top_k + (self.depth - 1) * self.top_k ** 2

  @property
  def window(self) -> int:
    return self.depth + 2

  @classmethod
  def parse(cls, text: str) -> "TreeShape":
    """'DEPTH,TOPK,NODES' (the --tree flag)."""
    try:
      depth, top_k, nodes = (int(x) for x in text.split(","))
    except ValueError:
      raise ValueError(f"--tree must be DEPTH,TOPK,NODES (three integers), got {text!r}") from None
    return cls(depth, top_k, nodes)


@dataclasses.dataclass(frozen=True, eq=False)
class TreeDrafter:
  """Pure functions of a tree drafter; hashes by identity (a static jit argument).

  prefill(params, prompt_BxT, lengths_B, capacity, features_BxTxF) -> state
  propose(params, state, window_BxW, window_positions_BxW, committed_B, rng, sampling,
          capacity, features_BxWxF) -> (tokens_BxN, parents_BxN, depth_BxN,
                                        draft_logits_BxNxV | None, state)
      parents index nodes (-1 = child of the root), parents[n] < n; depth is 1-based; draft
      logits (sampling only) row 0 = root's children distribution, row n+1 = node n's.
      sampling: spec_sampling.Filters, as for ChainDrafter.propose.
      features_BxWxF: the target's hidden features at the window positions when
      `feature_layers` is set (valid for every position but the last, which the target has not
      processed yet), else None.

  feature_layers: target layers whose outputs (pre-norm residual stream, the decoder's
  `hidden_layers` convention) the drafter reads; the target's `LanguageModelFns` must return
  exactly these, in this order, as its hidden states.
  param_shapes: the arrays the params must have, as `LanguageModelFns.param_shapes` (None:
  not checked).
  max_positions: the positions the drafter was trained for, as ChainDrafter's.
  takes_logit_edits: propose also takes `edits=` (a logit_edits.DraftLogitEdits, when the
      request edits the logits) and grows the tree under them, as ChainDrafter's: each node's
      children come from its edited logits, with its path as drafted context (under a
      structured-output guide, only tokens the grammar allows there).
  """

  prefill: Callable[..., Any]
  propose: Callable[..., tuple]
  shape: TreeShape
  vocab_size: int
  name: str = "tree-drafter"
  feature_layers: tuple[int, ...] = ()
  param_shapes: tuple | None = None
  max_positions: int | None = None
  takes_logit_edits: bool = False

  def __post_init__(self):
    if self.max_positions is not None:
      object.__setattr__(self, "max_positions",
                         check_positive_int("max_positions", self.max_positions))
    # Greedy trees take the top_k of the vocabulary; caught here, when the drafter is built,
    # rather than as JAX's bare top_k error once decoding is traced.
    if self.shape.top_k > self.vocab_size:
      raise ValueError(f"tree top_k={self.shape.top_k} exceeds the {self.name} drafter's "
                       f"vocabulary of {self.vocab_size} tokens")


def _children(logits_BxMxV, key, k, sampling: Filters):
  """k children per node: the top-k (greedy rules) or k i.i.d. draws (sampling); log q."""
  if sampling.greedy:
    logq_BxMxV = jax.nn.log_softmax(logits_BxMxV.astype(jnp.float32), axis=-1)
    logq_BxMxk, tok_BxMxk = jax.lax.top_k(logq_BxMxV, k)
    return tok_BxMxk.astype(jnp.int32), logq_BxMxk
  q_BxMxV = probabilities(logits_BxMxV, sampling)  # (per-row filters need rows leading)
  tok_kxBxM = categorical_rows(key, jnp.log(q_BxMxV), num=k)
  tok_BxMxk = jnp.moveaxis(tok_kxBxM, 0, -1).astype(jnp.int32)
  logq_BxMxk = jnp.log(jnp.take_along_axis(q_BxMxV, tok_BxMxk, axis=-1))
  return tok_BxMxk, logq_BxMxk


def grow_dynamic_tree(root_logits_BxV, expand, carry_root, shape: TreeShape, sampling,
                      keys, committed_B, capacity: int, slot_offset: int = 0,
                      edits: DraftLogitEdits | None = None):
  """Grows an EAGLE-2 dynamic tree (module docstring) from any expansion function.

  Args:
    root_logits_BxV: draft logits over the target vocabulary for the root's children.
    expand(front_tok_Bxk, carry_Bxk, positions_Bxk, slots_Bxk, visible_BxkxS)
        -> (logits_BxkxV over the target vocabulary, new_carry_Bxk)
      Runs the drafter on the k frontier nodes (writing its cache entries at `slots_Bxk`).
      `carry` is per-node payload the expansion needs (EAGLE: the drafter's hidden state).
    carry_root: payload of the root's children, leading axes [B, k] (or None).
    slot_offset: the frontier of depth d >= 2 goes to scratch slots starting at
      n + slot_offset + (d-2) k, at position n - 1 + (d - 1) + slot_offset, and sees committed
      slots < n + slot_offset (0 for LMs; -1 for EAGLE, whose entry p pairs token p+1).
    edits: the request's logit edits and the committed output's counts (None: none): the root's
      logits are edited as the target's next-token logits are, each frontier node's with its
      path as drafted context, before its children are chosen (and, sampling, as the draft
      distribution they were drawn from).

  Returns (tokens_BxN, parents_BxN, depth_BxN, draft_logits_BxNxV | None).
  """
  b = root_logits_BxV.shape[0]
  d_max, k, pool = shape.depth, shape.top_k, shape.pool_size
  if edits is not None:
    root_logits_BxV = edits.apply(root_logits_BxV)
  tok_Bxk, lp_Bxk = (x[:, 0] for x in _children(root_logits_BxV[:, None], keys[0], k, sampling))
  vocab = root_logits_BxV.shape[-1]
  pool_tok = jnp.zeros((b, pool), jnp.int32).at[:, :k].set(tok_Bxk)
  pool_lp = jnp.full((b, pool), -jnp.inf).at[:, :k].set(lp_Bxk)
  pool_parent = jnp.full((b, pool), -1, jnp.int32)
  pool_depth = jnp.zeros((b, pool), jnp.int32).at[:, :k].set(1)
  # Draft distribution rows per candidate (sampling only): the logits its children came from.
  pool_logits = None if sampling.greedy else jnp.zeros((b, pool, vocab), jnp.float32)
  front_idx_Bxk = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))
  front_anc_BxkxD = jnp.full((b, k, d_max), -1, jnp.int32)  # ancestors' scratch slots
  # The frontier's paths from the root, node included (-1 after): their drafted context.
  front_path_BxkxD = jnp.full((b, k, d_max), -1, jnp.int32).at[:, :, 0].set(tok_Bxk)
  carry = carry_root
  slot_iota_S = jnp.arange(capacity)
  base_B = committed_B + slot_offset
  rows_Bx1 = jnp.arange(b)[:, None]

  for d in range(2, d_max + 1):  # static and small: one drafter forward per depth
    front_tok = jnp.take_along_axis(pool_tok, front_idx_Bxk, axis=1)
    slots_Bxk = base_B[:, None] + (d - 2) * k + jnp.arange(k)
    anc_BxkxD = front_anc_BxkxD.at[:, :, d - 2].set(slots_Bxk)
    visible_BxkxS = (slot_iota_S[None, None] < base_B[:, None, None]) | (
        slot_iota_S[None, None, :, None] == anc_BxkxD[:, :, None, :]).any(-1)
    positions_Bxk = jnp.broadcast_to(base_B[:, None] - 1 + (d - 1), (b, k))
    logits_BxkxV, new_carry = expand(front_tok, carry, positions_Bxk, slots_Bxk, visible_BxkxS)
    if edits is not None:
      logits_BxkxV = edit_logits(logits_BxkxV, edits.counts, edits.edits, front_path_BxkxD)
    child_tok, child_lp = _children(logits_BxkxV, keys[d - 1], k, sampling)
    parent_lp = jnp.take_along_axis(pool_lp, front_idx_Bxk, axis=1)
    cand_lp_BxK2 = (parent_lp[:, :, None] + child_lp).reshape(b, k * k)
    start = k + (d - 2) * k * k
    cand = slice(start, start + k * k)
    pool_tok = pool_tok.at[:, cand].set(child_tok.reshape(b, k * k))
    pool_lp = pool_lp.at[:, cand].set(cand_lp_BxK2)
    pool_parent = pool_parent.at[:, cand].set(jnp.repeat(front_idx_Bxk, k, axis=1))
    pool_depth = pool_depth.at[:, cand].set(d)
    if pool_logits is not None:
      pool_logits = pool_logits.at[rows_Bx1, front_idx_Bxk].set(logits_BxkxV)
    # Next frontier: the k best new candidates (top_k keeps the earliest on ties).
    best_Bxk = jax.lax.top_k(cand_lp_BxK2, k)[1]
    front_idx_Bxk = (start + best_Bxk).astype(jnp.int32)
    parent_of_best = best_Bxk // k
    front_anc_BxkxD = jnp.take_along_axis(anc_BxkxD, parent_of_best[:, :, None], axis=1)
    front_path_BxkxD = jnp.take_along_axis(front_path_BxkxD, parent_of_best[:, :, None],
                                           axis=1).at[:, :, d - 1].set(
        jnp.take_along_axis(child_tok.reshape(b, k * k), best_Bxk, axis=1))
    if new_carry is not None:
      carry = jnp.take_along_axis(new_carry, parent_of_best.reshape(
          b, k, *([1] * (new_carry.ndim - 2))), axis=1)

  if sampling.greedy:
    # Best N by cumulative log-prob, ties to the earlier candidate; then back to pool order,
    # which is topological (parents come first).
    keep_BxN = jnp.sort(jax.lax.top_k(pool_lp, shape.num_nodes)[1], axis=1)
  else:
    keep_BxN = jnp.broadcast_to(jnp.arange(pool, dtype=jnp.int32), (b, pool))
  tokens_BxN = jnp.take_along_axis(pool_tok, keep_BxN, axis=1)
  depth_BxN = jnp.take_along_axis(pool_depth, keep_BxN, axis=1)
  parent_pool_BxN = jnp.take_along_axis(pool_parent, keep_BxN, axis=1)
  # pool index -> node index (kept nodes only; parents of kept nodes are always kept).
  node_of_pool = jnp.full((b, pool), -1, jnp.int32).at[rows_Bx1, keep_BxN].set(
      jnp.arange(keep_BxN.shape[1], dtype=jnp.int32))
  parents_BxN = jnp.where(parent_pool_BxN >= 0, jnp.take_along_axis(
      node_of_pool, jnp.maximum(parent_pool_BxN, 0), axis=1), -1)
  draft_logits = None
  if pool_logits is not None:
    node_logits = jnp.take_along_axis(pool_logits, keep_BxN[:, :, None], axis=1)
    draft_logits = jnp.concatenate([root_logits_BxV[:, None], node_logits[:, :-1]], axis=1)
  return tokens_BxN, parents_BxN, depth_BxN, draft_logits


def lm_tree_drafter(fns: LanguageModelFns, shape: TreeShape) -> TreeDrafter:
  """A dynamic-tree drafter from any language model with `tree_forward` (own KV cache).

  Built once per (fns, shape): calling it again returns the same drafter, so the decode loop
  compiled for it is reused (asd_jax.drafter_api.DRAFTERS_KEPT)."""
  check_type("fns", fns, LanguageModelFns)
  if not isinstance(shape, TreeShape):
    raise TypeError(f"shape must be a TreeShape, e.g. TreeShape(depth=4, top_k=4, num_nodes=16) "
                    f"or TreeShape.parse('4,4,16'), got {shape!r}")
  if fns.tree_forward is None:
    raise ValueError(f"model {fns.name!r} has no tree_forward; it cannot draft trees")
  return _lm_tree_drafter(fns, shape)


@functools.lru_cache(maxsize=DRAFTERS_KEPT)
def _lm_tree_drafter(fns: LanguageModelFns, shape: TreeShape) -> TreeDrafter:
  def prefill(params, prompt_BxT, lengths_B, capacity, features_BxTxF=None):
    cache = fns.init_cache(prompt_BxT.shape[0], capacity)
    return fns.prefill(params, prompt_BxT, lengths_B, cache)[2]

  def propose(params, cache, window_BxW, window_pos_BxW, committed_B, rng, sampling, capacity,
              features_BxWxF=None, edits=None):
    keys = split_keys(rng, shape.depth)
    logits_BxWxV, _, cache = fns.forward(params, window_BxW, window_pos_BxW, cache)

    def expand(front_tok, carry, positions, slots, visible):
      nonlocal cache
      logits, _, cache = fns.tree_forward(params, front_tok, positions, slots, visible, cache)
      return logits, None

    tree = grow_dynamic_tree(logits_BxWxV[:, -1], expand, None, shape, sampling, keys,
                             committed_B, capacity, edits=edits)
    return (*tree, cache)

  return TreeDrafter(prefill=prefill, propose=propose, shape=shape, vocab_size=fns.vocab_size,
                     name=fns.name, param_shapes=fns.param_shapes,
                     max_positions=fns.max_positions, takes_logit_edits=True)
