"""Draft paths from an EAGLE-3 drafter at sampled context positions (VSD's E-step proposals).

Shape notation: vsd_jax/data.py, plus P sampled positions per row, S paths per position, d
path depth, C drafter cache slots.

A path from row p is z_0..z_{d-1}, the tokens at p + 2 .. p + 1 + d (alignment of
vsd_jax/objective_api.py). z_0 comes from the drafter's step-0 distribution at row p (its
teacher-forced context state, computed by the TTT unroll). Entry E_i (i >= 1) of a path reads
token z_{i-1} (mapped to its target id, as the decoder feeds it) and the out_hidden of E_{i-1}
(E_0: the step-0 row p) at RoPE position p + i, attends to the step-0 context slots <= p plus
its own ancestors' entries, and gives the distribution of z_i: exactly the state a draft chain
or tree has at decode time (models/eagle3.py), and the TTT unroll's state at step i when the
path follows the data.

Proposals (`proposal`):
  tree  EAGLE-2's dynamic-tree expansion as the decoder grows it (asd_jax/draft_tree.py): every
        frontier path expands its top-k children, all candidates are re-ranked globally by
        cumulative draft log-probability, and the best S are kept (depth 0: the root's top-k,
        so S > k leaves S - k paths invalid at depth 0 only if the root has fewer candidates).
  iid   S independent samples at temperature 1.
  greedy  the argmax chain (S copies; diagnostics use S = 1).
  forced  the given tokens (`forced_BxPxd`, S copies; VSD's continuation scores the oracle's
          own chain with S = 1). Sentinel ids (< 0) are read as id 0: the caller masks the
          depths from the first sentinel on.
Selection is discrete (no gradient); the returned log-probabilities are differentiable.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from models.eagle3 import Eagle3Drafter, draft_to_target_ids
from models.kv_cache import KVCache
from vsd_jax.vsd_paths import NOT_DRAFTABLE, UNKNOWN

PROPOSALS = ("tree", "iid", "greedy", "forced")
_NEG = -1e30  # finite "minus infinity" for invalid candidates (keeps top_k and sums NaN-free)


@dataclasses.dataclass(frozen=True)
class DraftPaths:
  """S draft paths per position and the drafter's distributions along them.

  tokens  int32 [B, P, S, d]  draft ids
  valid   bool [B, P, S]      False for padding paths (fewer candidates than S)
  logq    d arrays: depth 0 [B, P, Vd] (shared by all paths), depth i >= 1 [B, P, S, Vd]
          (indexed by entry, see `entry`)
  entry   int32 [B, P, S, d]  which depth-i entry a path's z_i was drawn from (0 at depth 0)
  """

  tokens: jax.Array
  valid: jax.Array
  logq: tuple[jax.Array, ...]
  entry: jax.Array

  def log_prob(self, tokens_BxPxSxd) -> jax.Array:
    """float32 [B, P, S, d]: log q(tokens[..., i] | the path's prefix) at each depth i.

    Valid for any tokens that share each path's prefix up to depth i (a corrected path
    does: it only changes the token at its first rejected depth). Negative ids read id 0.
    """
    safe = jnp.maximum(tokens_BxPxSxd, 0)
    out = [jnp.take_along_axis(self.logq[0], safe[..., 0], axis=-1)]
    for i in range(1, len(self.logq)):
      rows = jnp.take_along_axis(self.logq[i], self.entry[..., i][..., None], axis=2)
      out.append(jnp.take_along_axis(rows, safe[..., i][..., None], axis=-1)[..., 0])
    return jnp.stack(out, axis=-1)

  def max_prob(self) -> jax.Array:
    """float32 [B, P, S, d]: the drafter's max probability at each node of each path."""
    out = [jnp.broadcast_to(jnp.exp(self.logq[0].max(-1))[..., None], self.valid.shape)]
    for i in range(1, len(self.logq)):
      m = jnp.exp(self.logq[i].max(-1))
      out.append(jnp.take_along_axis(m, self.entry[..., i], axis=2))
    return jnp.stack(out, axis=-1)


def sample_positions(key, loss_mask_BxT, num: int):
  """(rows p int32 [B, P], valid bool [B, P]): P distinct rows per sequence, chosen uniformly
  among those whose first draft token (p + 2) is a response token."""
  b, t = loss_mask_BxT.shape
  if num > t:
    raise ValueError(f"cannot sample {num} positions from sequences of length {t}")
  ok = jnp.concatenate([loss_mask_BxT[:, 2:] > 0, jnp.zeros((b, 2), bool)], axis=1)
  score = jnp.where(ok, jax.random.uniform(key, (b, t)), -1.0)
  top, rows = jax.lax.top_k(score, num)
  return rows.astype(jnp.int32), top >= 0


def oracle_tokens(tokens_BxT, loss_mask_BxT, t2d_index_Vt, rows_BxP, depth: int):
  """int32 [B, P, d]: the data tokens at p + 2 + j as draft ids (vsd_jax/vsd_paths.py
  sentinels: UNKNOWN outside the response, NOT_DRAFTABLE outside the draft vocabulary)."""
  t = tokens_BxT.shape[1]
  at = rows_BxP[..., None] + 2 + jnp.arange(depth)
  inside = at < t
  at = jnp.minimum(at, t - 1)
  tok = jnp.take_along_axis(tokens_BxT[:, None, :], at, axis=-1)
  resp = jnp.take_along_axis(loss_mask_BxT[:, None, :], at, axis=-1) > 0
  draft = t2d_index_Vt[tok]
  return jnp.where(inside & resp, jnp.where(draft >= 0, draft, NOT_DRAFTABLE),
                   UNKNOWN).astype(jnp.int32)


def _gather_rows(x_BxTx_, rows_BxP):
  return jnp.take_along_axis(x_BxTx_, rows_BxP.reshape(rows_BxP.shape + (1,) * (x_BxTx_.ndim - 2)),
                             axis=1)


def rollout(drafter: Eagle3Drafter, cache: KVCache, *, context_len: int, first_free_slot: int,
            logits0_BxTxVd, hidden0_BxTxD, rows_BxP, num_paths: int, depth: int,
            proposal: str, top_k: int, key, forced_BxPxd=None) -> DraftPaths:
  """Grows S draft paths of depth d from each row p in `rows_BxP`.

  cache: the drafter cache after the TTT unroll; slots < context_len hold the step-0
  (context) entries at slot == row; (d - 1) * P * S free slots from `first_free_slot` take the
  path entries. logits0 / hidden0: the step-0 logits and out_hidden over all rows.
  """
  if proposal not in PROPOSALS:
    raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}")
  if (proposal == "forced") != (forced_BxPxd is not None):
    raise ValueError("forced_BxPxd is given exactly when proposal='forced'")
  if num_paths <= 0 or depth <= 0 or top_k <= 0:
    raise ValueError(f"num_paths, depth and top_k must be positive, got "
                     f"{num_paths}, {depth}, {top_k}")
  b, n_pos = rows_BxP.shape
  s = num_paths
  capacity = cache.capacity
  slots_C = jnp.arange(capacity)
  if first_free_slot + (depth - 1) * n_pos * s > capacity:
    raise ValueError(f"the drafter cache has {capacity} slots, the paths need "
                     f"{first_free_slot + (depth - 1) * n_pos * s}")
  # Context visibility of every path entry from row p: step-0 slots 0..p.
  context_BxPxC = (slots_C < context_len)[None, None] & (slots_C[None, None] <= rows_BxP[..., None])

  logq0 = jax.nn.log_softmax(_gather_rows(logits0_BxTxVd, rows_BxP).astype(jnp.float32), -1)
  score0 = jax.lax.stop_gradient(logq0)
  keys = jax.random.split(key, depth)

  # Depth 0: a single frontier node (the root).
  cum = jnp.full((b, n_pos, s), _NEG).at[..., 0].set(0.0)
  root_logq = jnp.broadcast_to(score0[:, :, None], (b, n_pos, s) + score0.shape[-1:])
  forced = None if forced_BxPxd is None else jnp.maximum(forced_BxPxd, 0).astype(jnp.int32)
  tokens, cum, _ = _select(proposal, root_logq, cum, s, top_k, keys[0], at_root=True,
                           forced_BxP=None if forced is None else forced[..., 0])
  paths = tokens[..., None]
  entry = jnp.zeros((b, n_pos, s, 1), jnp.int32)
  hidden_in = jnp.broadcast_to(_gather_rows(hidden0_BxTxD, rows_BxP)[:, :, None],
                               (b, n_pos, s, hidden0_BxTxD.shape[-1]))
  ancestors = jnp.zeros((b, n_pos, s, 0), jnp.int32)  # slots of E_1..E_{i-1} along the path
  logqs = [logq0]
  positions_BxPxS = jnp.broadcast_to(rows_BxP[..., None], (b, n_pos, s))
  for i in range(1, depth):
    own_slots = (first_free_slot + (i - 1) * n_pos * s
                 + jnp.arange(n_pos * s, dtype=jnp.int32).reshape(1, n_pos, s))
    own_slots = jnp.broadcast_to(own_slots, (b, n_pos, s))
    visible = context_BxPxC[:, :, None] | (slots_C == own_slots[..., None])
    for a in range(i - 1):
      visible = visible | (slots_C == ancestors[..., a][..., None])
    # The drafter embeds target ids (its embedding is the target's); paths hold draft ids.
    inputs = draft_to_target_ids(drafter.d2t[...], paths[..., -1])
    logits, out_hidden, cache = drafter(
        inputs.reshape(b, n_pos * s), hidden_in.reshape(b, n_pos * s, -1),
        (positions_BxPxS + i).reshape(b, n_pos * s), cache,
        slots_BxT=own_slots.reshape(b, n_pos * s),
        visible_BxTxS=visible.reshape(b, n_pos * s, -1))
    logq = jax.nn.log_softmax(logits.astype(jnp.float32), -1).reshape(b, n_pos, s, -1)
    logqs.append(logq)
    token, cum, parent = _select(proposal, jax.lax.stop_gradient(logq), cum, s, top_k, keys[i],
                                 forced_BxP=None if forced is None else forced[..., i])
    take = lambda x: jnp.take_along_axis(x, parent.reshape(parent.shape + (1,) * (x.ndim - 3)),
                                         axis=2)
    paths = jnp.concatenate([take(paths), token[..., None]], axis=-1)
    entry = jnp.concatenate([take(entry), parent[..., None]], axis=-1)
    ancestors = jnp.concatenate([take(ancestors), take(own_slots[..., None])], axis=-1)
    hidden_in = take(out_hidden.reshape(b, n_pos, s, -1))
  return DraftPaths(tokens=paths, valid=cum > _NEG / 2, logq=tuple(logqs), entry=entry)


def _select(proposal: str, logq_BxPxSxV, cum_BxPxS, s: int, top_k: int, key,
            at_root: bool = False, forced_BxP=None):
  """Next tokens for S paths: (token, cumulative log q, parent path), each [B, P, S].

  At the root only path 0 is a real frontier node (the others are its copies)."""
  frontier_ok = cum_BxPxS > _NEG / 2
  if proposal == "tree":
    k = min(top_k, logq_BxPxSxV.shape[-1])
    top_logq, top_ids = jax.lax.top_k(logq_BxPxSxV, k)  # [B, P, S, k]
    cand = jnp.where(frontier_ok[..., None], cum_BxPxS[..., None] + top_logq, _NEG)
    flat = cand.reshape(cand.shape[:2] + (-1,))
    best, idx = jax.lax.top_k(flat, s)
    parent = (idx // k).astype(jnp.int32)
    token = jnp.take_along_axis(top_ids.reshape(flat.shape), idx, axis=-1).astype(jnp.int32)
    return token, jnp.where(best > _NEG / 2, best, _NEG), parent
  parent = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32) * (not at_root), cum_BxPxS.shape)
  logq = jnp.take_along_axis(logq_BxPxSxV, parent[..., None], axis=2)
  if proposal == "greedy":
    token = jnp.argmax(logq, -1).astype(jnp.int32)
  elif proposal == "forced":
    token = jnp.broadcast_to(forced_BxP[..., None], cum_BxPxS.shape)
  else:
    token = jax.random.categorical(key, logq, axis=-1).astype(jnp.int32)
  cum = jnp.take_along_axis(jnp.where(frontier_ok, cum_BxPxS, 0.0), parent, axis=2)
  cum = cum + jnp.take_along_axis(logq, token[..., None], axis=-1)[..., 0]
  return token, cum, parent
