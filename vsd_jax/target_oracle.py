"""VSD's oracle from the target itself (`vsd_oracle=target`): one tree-masked target forward.

Needed when the training text is not the target's own greedy output (human data, sampled
answers); with target-regenerated greedy data it returns the data tokens (tested), which is
why `vsd_oracle=data` can skip it.

Every path gets its own copy of its d nodes (no prefix sharing: P * S * d nodes per row, all
in one forward). Node (s, j) holds z_j at position p + 2 + j, in cache slot T + its index, and
attends to the context slots <= p + 1 and to its own path's nodes at depths <= j. The target's
argmax at the context row p + 1 is the oracle for depth 0 of every path; its argmax at node
(s, j - 1) is the oracle for depth j of path s. The same logits give the target's
probability of every path token (`target_verdicts`), which `vsd_utility=expected` needs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.eagle3 import draft_to_target_ids
from models.kv_cache import KVCache
from models.llama import Decoder
from vsd_jax.vsd_paths import NOT_DRAFTABLE


def target_oracle(target: Decoder, tokens_BxT, rows_BxP, paths_BxPxSxd, d2t_Vd, t2d_index_Vt):
  """int32 [B, P, S, d]: the target's greedy token after each path prefix, as draft ids
  (NOT_DRAFTABLE where the target's choice is outside the draft vocabulary)."""
  return target_verdicts(target, tokens_BxT, rows_BxP, paths_BxPxSxd, d2t_Vd, t2d_index_Vt)[0]


def target_verdicts(target: Decoder, tokens_BxT, rows_BxP, paths_BxPxSxd, d2t_Vd, t2d_index_Vt):
  """(oracle int32 [B, P, S, d] as in `target_oracle`, log p float32 [B, P, S, d]: the
  target's log-probability (temperature 1, full vocabulary) of each path token z_j after the
  path's own prefix z_<j), from the same forward."""
  b, t = tokens_BxT.shape
  _, n_pos, s, d = paths_BxPxSxd.shape
  n = n_pos * s * d
  cache = KVCache.create(target.cfg, b, t + n)
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  root_logits, _, cache = target(tokens_BxT, positions, cache, logits_at_BxR=rows_BxP + 1)
  node_pos = rows_BxP[:, :, None, None] + 2 + jnp.arange(d, dtype=jnp.int32)  # [B, P, 1, d]
  node_pos = jnp.broadcast_to(node_pos, paths_BxPxSxd.shape)
  slots = t + jnp.arange(n, dtype=jnp.int32).reshape(1, n_pos, s, d)
  slots_C = jnp.arange(t + n)
  context = (slots_C < t) & (slots_C <= rows_BxP[:, :, None, None, None] + 1)  # [B,P,1,1,C]
  own = ((slots_C >= slots[..., :1, None]) & (slots_C <= slots[..., None]))  # same path, <= j
  visible = (context | own).reshape(b, n, t + n)
  path_ids = draft_to_target_ids(d2t_Vd, paths_BxPxSxd)
  node_logits, _, _ = target(path_ids.reshape(b, n),
                             node_pos.reshape(b, n), cache,
                             slots_BxT=jnp.broadcast_to(slots, paths_BxPxSxd.shape).reshape(b, n),
                             visible_BxTxS=visible)
  # The distribution of z_j: the context row p + 1 for j = 0, node (s, j - 1) after that.
  node_logits = node_logits.reshape(b, n_pos, s, d, -1)
  root = jnp.argmax(root_logits, -1)  # [B, P]
  after = jnp.argmax(node_logits, -1)
  greedy = jnp.concatenate([jnp.broadcast_to(root[:, :, None, None], (b, n_pos, s, 1)),
                            after[..., :-1]], axis=-1)
  draft = t2d_index_Vt[greedy]
  oracle = jnp.where(draft >= 0, draft, NOT_DRAFTABLE).astype(jnp.int32)
  root_logp = jnp.take_along_axis(  # [B, P, S]
      jax.nn.log_softmax(root_logits.astype(jnp.float32), -1), path_ids[..., 0], axis=-1)
  node_logp = jnp.take_along_axis(  # [B, P, S, d - 1]
      jax.nn.log_softmax(node_logits[..., :-1, :].astype(jnp.float32), -1),
      path_ids[..., 1:, None], axis=-1)[..., 0]
  return oracle, jnp.concatenate([root_logp[..., None], node_logp], axis=-1)
