"""The trainer's plug point: an `Objective` bundles a drafter's parameters with pure functions.

Batches (see vsd_jax/data.py for the notation) are dicts of device arrays:
    tokens int32 [B, T], loss_mask float32 [B, T] (1 on target-response tokens), length int32 [B]
and, with offline features, "features" [B, T, N, D] (the target hidden layers the objective
reads, see `target_hidden`).

Alignment shared by every objective's `ranks_fn`: entry [b, p, j] is about the token at
p + 2 + j, the j-th draft token of a round whose last committed token sits at p + 1 (for
EAGLE-3: features of p paired with token p + 1, as models/eagle3.py documents). That is what
vsd_jax/simulated_tau.py replays.

An objective over the same drafter (VSD, specs/vsd.md: vsd_jax/vsd_objective.py) supplies its
own `loss_fn` over the same parameters and batches; nothing else in the trainer changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from models.kv_cache import KVCache
from models.llama import Decoder

# loss_fn(trainable, frozen, batch, rng) -> (scalar loss, dict of scalar metrics)
LossFn = Callable[[Any, Any, dict, jax.Array], tuple[jax.Array, dict]]
# ranks_fn(trainable, frozen, batch) -> int32 [B, T, K]: rank of the data token at p + 2 + j
# among the drafter's step-j scores at row p (0: it is the drafter's top-1).
RanksFn = Callable[[Any, Any, dict], jax.Array]


@dataclasses.dataclass(frozen=True, eq=False)
class Objective:
  """A drafter, its initial trainable/frozen state and its pure loss (hashes by identity).

  trainable: the pytree the optimiser updates (float32 master copy).
  frozen: everything else the functions read: the drafter's non-trained state (shared
    embedding, vocabulary map) and the frozen target's parameters, under "target".
  export(trainable, frozen) -> an NNX drafter module for models/drafter_checkpoint.save_drafter.
  describe: JSON-ready facts a checkpoint must agree with to be resumed.
  """

  name: str
  trainable: Any
  frozen: Any
  loss_fn: LossFn
  ranks_fn: RanksFn
  export: Callable[[Any, Any], nnx.Module]
  describe: dict
  num_steps: int  # K of ranks_fn
  target_hidden_layers: tuple[int, ...]  # what an offline feature cache must hold
  # diagnostics_fn(trainable, frozen, batch) -> dict of counts summed over held-out batches
  # (EAGLE-3: vsd_jax/vsd_diagnostics.py); None: the drafter has none.
  diagnostics_fn: Callable[[Any, Any, dict], dict] | None = None


def cast_floats(tree, dtype):
  """Floating leaves to `dtype` (mixed precision: float32 master weights, `dtype` compute)."""
  dtype = jnp.dtype(dtype)
  return jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating)
                      else x, tree)


def target_hidden(target_graphdef, target_params, batch, hidden_layers: tuple[int, ...]):
  """Frozen target hidden states [B, T, N, D] of `hidden_layers` (layer outputs), no gradient.

  Online by default: one target forward over the batch; an offline cache supplies
  batch["features"] instead.
  """
  if "features" in batch:
    return batch["features"]
  model: Decoder = nnx.merge(target_graphdef, target_params)
  tokens_BxT = batch["tokens"]
  b, t = tokens_BxT.shape
  positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  _, hidden, _ = model(tokens_BxT, positions_BxT, KVCache.create(model.cfg, b, t),
                       hidden_layers=hidden_layers, logits_at_BxR=jnp.zeros((b, 1), jnp.int32))
  return jax.lax.stop_gradient(hidden)


def shift_left(x_BxT, by: int, fill=0):
  """x[:, p + by] at column p; columns past the end hold `fill` (all of them when by >= T)."""
  if by == 0:
    return x_BxT
  by = min(by, x_BxT.shape[1])
  pad = jnp.full((x_BxT.shape[0], by) + x_BxT.shape[2:], fill, x_BxT.dtype)
  return jnp.concatenate([x_BxT[:, by:], pad], axis=1)


def rank_of(logits_BxTxV, ids_BxT):
  """Rank of `ids` among the logits (number of strictly larger scores); id < 0 -> V."""
  v = logits_BxTxV.shape[-1]
  safe = jnp.clip(ids_BxT, 0, v - 1)
  own = jnp.take_along_axis(logits_BxTxV, safe[..., None], axis=-1)
  rank = (logits_BxTxV > own).sum(-1).astype(jnp.int32)
  return jnp.where(ids_BxT >= 0, rank, v)


def weighted_mean(x, w):
  return (x * w).sum() / jnp.maximum(w.sum(), 1.0)
