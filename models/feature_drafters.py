"""EAGLE-3 and Medusa behind the engines' `TreeDrafter` interface (chains are depth-K, top-1
trees).

Shape notation: B rows, W window, k top-k, D width, Vd draft vocab, V target vocab, M heads.

EAGLE-3 token alignment (vLLM's EagleProposer): drafter entry p pairs the target's features at
position p with the token at p+1, sits at RoPE position p and predicts the token at p+2. The
engine hands over the last W committed tokens with the target's features at their positions
(the last one has none yet), so entries p = n-W .. n-2 are (re)written each round; the last
predicts position n, the root's children. Deeper nodes pair the drafter's own hidden state
with the node token, one position further (EAGLE-3's draft-time recurrence).

Medusa (Cai et al. 2024): head m reads the target's last hidden state after its final norm at
the newest processed position (n-2) and scores the token at n + m. Trees are static
(Medusa-style branch choices: a path (r_1, ..., r_d) takes head i's r_i-th best token at depth
i). Medusa heads do not see the branch they extend, so every node at a depth gets the same
candidates; deterministic trees make lossless sampling impossible, so `rule="sample"` is
refused for Medusa.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.drafter_api import DRAFTERS_KEPT
from asd_jax.draft_tree import TreeDrafter, TreeShape, grow_dynamic_tree
from asd_jax.request_checks import ParamShapes, param_shapes
from asd_jax.sampling_keys import split_keys
from models.config import ModelConfig
from models.eagle3 import Eagle3Fns, draft_logits_to_target
from models.llama import Decoder, rms_norm
from models.medusa import MedusaConfig, MedusaHeads, medusa_logits


@functools.lru_cache(maxsize=DRAFTERS_KEPT)
def eagle3_tree_drafter(fns: Eagle3Fns, shape: TreeShape) -> TreeDrafter:
  """A dynamic-tree (EAGLE-2 style) drafter from an EAGLE-3 head; params = eagle3_fns' params.

  Built once per (fns, shape): calling it again returns the same drafter, so the decode loop
  compiled for it is reused (asd_jax.drafter_api.DRAFTERS_KEPT)."""
  cfg = fns.cfg
  vocab = cfg.target_vocab_size

  def to_target(params, logits_xVd):
    return draft_logits_to_target(params["d2t"][...], logits_xVd, vocab)

  def pairs(params, tokens_BxW, positions_BxW, features_BxWxF, cache, capacity):
    """Writes entries (f_p, t_{p+1}) at p; returns the last row's logits and hidden."""
    pos_BxW1 = positions_BxW[:, :-1]
    # Windows of short prompts repeat position 0; only a real step (p+1 > p) may write.
    real_BxW1 = positions_BxW[:, 1:] > pos_BxW1
    slots_BxW1 = jnp.where(real_BxW1, pos_BxW1, capacity)
    visible = jnp.arange(capacity)[None, None] <= pos_BxW1[:, :, None]
    logits, hidden, cache = fns.step(params, tokens_BxW[:, 1:], features_BxWxF[:, :-1], pos_BxW1,
                                     cache, slots_BxT=slots_BxW1, visible_BxTxS=visible)
    return logits[:, -1], hidden[:, -1], cache

  def prefill(params, prompt_BxT, lengths_B, capacity, features_BxTxF):
    b, t = prompt_BxT.shape
    cache = fns.init_cache(b, capacity)
    if t < 2:
      return cache
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    return pairs(params, prompt_BxT, positions, features_BxTxF, cache, capacity)[2]

  def propose(params, cache, window_BxW, window_pos_BxW, committed_B, rng, sampling, capacity,
              features_BxWxF, edits=None):
    keys = split_keys(rng, shape.depth)
    root_logits, root_hidden_BxD, cache = pairs(params, window_BxW, window_pos_BxW,
                                                features_BxWxF, cache, capacity)
    carry_root = jnp.broadcast_to(root_hidden_BxD[:, None], (root_hidden_BxD.shape[0],
                                                             shape.top_k, cfg.hidden_size))

    def expand(front_tok, carry_BxkxD, positions, slots, visible):
      nonlocal cache
      logits, hidden, cache = fns.step(params, front_tok, carry_BxkxD, positions, cache,
                                       slots_BxT=slots, visible_BxTxS=visible)
      return to_target(params, logits), hidden

    tree = grow_dynamic_tree(to_target(params, root_logits), expand, carry_root, shape,
                             sampling, keys, committed_B, capacity, slot_offset=-1, edits=edits)
    return (*tree, cache)

  return TreeDrafter(prefill=prefill, propose=propose, shape=shape, vocab_size=vocab,
                     name="eagle3", feature_layers=tuple(cfg.fused_layers),
                     param_shapes=fns.param_shapes, max_positions=cfg.max_position_embeddings,
                     takes_logit_edits=True)


def medusa_choices(shape: TreeShape, num_heads: int) -> list[tuple[int, ...]]:
  """A static tree of `shape.num_nodes` paths: ranks < top_k, depth <= min(depth, heads),
  most promising first (smallest rank sum, then shallower), closed under prefixes."""
  depth = min(shape.depth, num_heads)
  # A prefix sorts before its extensions (rank sum no larger, shorter), so the first N paths in
  # that order are prefix-closed. Enumerate by rank sum and stop at N: listing all top_k^depth
  # paths would take minutes and gigabytes for wide shapes such as (4, 70, 16).
  chosen: list[tuple[int, ...]] = []
  for total in range(depth * (shape.top_k - 1) + 1):
    level = sorted(p for d in range(1, depth + 1) for p in _paths_with_sum(total, d, shape.top_k))
    level.sort(key=len)  # stable: (sum, len, p) order
    chosen += level[:shape.num_nodes - len(chosen)]
    if len(chosen) == shape.num_nodes:
      break
  return sorted(chosen, key=lambda p: (len(p), p))  # parents before children


def _paths_with_sum(total: int, length: int, top_k: int):
  """Every rank tuple of `length` entries in [0, top_k) that sums to `total`."""
  if length == 0:
    if total == 0:
      yield ()
    return
  for first in range(min(total, top_k - 1) + 1):
    if total - first <= (length - 1) * (top_k - 1):
      for rest in _paths_with_sum(total - first, length - 1, top_k):
        yield (first, *rest)


def medusa_tree_drafter(heads: MedusaHeads, target: Decoder, shape: TreeShape,
                        choices: list[tuple[int, ...]] | None = None) -> TreeDrafter:
  """A static-tree drafter from Medusa heads on `target`'s last hidden state.

  params for the engine: `medusa_drafter_params(heads, target)`. Built once per (heads' and
  target's configs and array shapes, tree): calling it again returns the same drafter, so the
  decode loop compiled for it is reused (asd_jax.drafter_api.DRAFTERS_KEPT).
  """
  choices = tuple(tuple(p) for p in (choices or medusa_choices(shape, heads.cfg.num_heads)))
  depth = max(len(p) for p in choices)
  if depth > heads.cfg.num_heads:
    raise ValueError(f"tree depth {depth} needs {depth} Medusa heads, these have "
                     f"{heads.cfg.num_heads}")
  return _medusa_tree_drafter(heads.cfg, target.cfg, choices,
                              param_shapes(medusa_drafter_params(heads, target)))


@functools.lru_cache(maxsize=DRAFTERS_KEPT)
def _medusa_tree_drafter(heads_cfg: MedusaConfig, cfg: ModelConfig,
                         choices: tuple[tuple[int, ...], ...],
                         shapes: ParamShapes) -> TreeDrafter:
  depth = max(len(p) for p in choices)
  index = {p: i for i, p in enumerate(choices)}
  parents_N = np.array([index.get(p[:-1], -1) for p in choices], np.int32)
  head_N = np.array([len(p) - 1 for p in choices], np.int32)
  rank_N = np.array([p[-1] for p in choices], np.int32)
  top_k = int(rank_N.max()) + 1
  eps = cfg.rms_norm_eps

  def prefill(params, prompt_BxT, lengths_B, capacity, features_BxTxF):
    return ()

  def propose(params, state, window_BxW, window_pos_BxW, committed_B, rng, sampling, capacity,
              features_BxWxF):
    if not sampling.greedy:
      raise ValueError("Medusa static trees are deterministic: use rule strict or asd")
    heads_params, norm_scale_D, head_VxD = params
    # The newest position the target processed, through the target's final norm as in
    # training (vsd_jax/medusa_loss.py applies target.final_norm to the same hidden state).
    h_BxD = rms_norm(features_BxWxF[:, -2], norm_scale_D, eps)
    logits_BxMxV = medusa_logits(heads_params, h_BxD[:, None],
                                 None if heads_cfg.own_head else head_VxD)[:, 0]
    top_BxMxk = jax.lax.top_k(logits_BxMxV, top_k)[1].astype(jnp.int32)
    b = h_BxD.shape[0]
    tokens_BxN = top_BxMxk[:, head_N, rank_N]
    parents_BxN = jnp.broadcast_to(jnp.asarray(parents_N), (b, len(choices)))
    depth_BxN = jnp.broadcast_to(jnp.asarray(head_N + 1), (b, len(choices)))
    return tokens_BxN, parents_BxN, depth_BxN, None, state

  tree_shape = TreeShape(depth=depth, top_k=top_k, num_nodes=len(choices))
  return TreeDrafter(prefill=prefill, propose=propose, shape=tree_shape,
                     vocab_size=cfg.vocab_size, name="medusa",
                     feature_layers=(cfg.num_layers - 1,), param_shapes=shapes)


def medusa_drafter_params(heads: MedusaHeads, target: Decoder):
  """The engine-side params of a Medusa drafter: (heads state, target final norm, target head).

  The target's pieces ride along as arrays, so no weights are copied.
  """
  import flax.nnx as nnx
  return (nnx.state(heads), target.final_norm.scale[...], target.head_VxD())
