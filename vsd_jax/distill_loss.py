"""Standalone-LM distillation: a small decoder (copies of chosen target layers, the target's
frozen embedding) trained with KL(target || drafter) on the full vocabulary at every position
whose next token is a response token.

Simulated-tau ranks: with the chain's accepted prefix equal to the data, draft step j of the
round at row p is the drafter's teacher-forced prediction at p + 1 + j.
"""

from __future__ import annotations

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.kv_cache import KVCache
from models.llama import Decoder
from vsd_jax.objective_api import Objective, cast_floats, rank_of, shift_left, weighted_mean


def init_standalone(target: Decoder, init_layers: tuple[int, ...]) -> Decoder:
  """A len(init_layers)-layer decoder holding copies of those target layers, its final norm
  and its embedding (frozen in training, so a saved folder can borrow the target's)."""
  cfg = dataclasses.replace(target.cfg, num_layers=len(init_layers))
  flat = dict(nnx.to_flat_state(nnx.state(target)))
  model = nnx.eval_shape(lambda: Decoder(cfg, nnx.Rngs(0)))
  graphdef, state = nnx.split(model)
  new = {}
  for path, _ in nnx.to_flat_state(state):
    src = ("layers", init_layers[path[1]]) + path[2:] if path[0] == "layers" else path
    new[path] = jax.tree.map(jnp.copy, flat[src])
  return nnx.merge(graphdef, nnx.from_flat_state(new))


def full_logits(model: Decoder, tokens_BxT):
  b, t = tokens_BxT.shape
  positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  return model(tokens_BxT, positions, KVCache.create(model.cfg, b, t))[0]


def make_distill_objective(cfg, target: Decoder, token_counts_Vt: np.ndarray) -> Objective:
  del token_counts_Vt
  tcfg = target.cfg
  layers = tuple(cfg.standalone_layers)
  if not layers or not all(0 <= i < tcfg.num_layers for i in layers):
    raise ValueError(f"standalone_layers {layers} must name layers of the "
                     f"{tcfg.num_layers}-layer target")
  drafter = init_standalone(target, layers)
  graphdef, trainable, frozen_drafter = nnx.split(
      drafter, nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed"))), ...)
  compute_graphdef = nnx.split(nnx.eval_shape(lambda: Decoder(
      drafter.cfg.with_dtype(cfg.dtype), nnx.Rngs(0))))[0]
  target_graphdef, target_params = nnx.split(target)
  steps = max(cfg.eval_k, cfg.eval_tree[0])  # simulated-tau depth

  def drafter_logits(trainable, frozen, batch):
    model = nnx.merge(compute_graphdef, cast_floats(trainable, cfg.dtype),
                      cast_floats(frozen["drafter"], cfg.dtype))
    return full_logits(model, batch["tokens"])

  def loss_fn(trainable, frozen, batch, rng):
    del rng
    q_logits = drafter_logits(trainable, frozen, batch)
    p_logits = jax.lax.stop_gradient(full_logits(nnx.merge(target_graphdef, frozen["target"]),
                                                 batch["tokens"]))
    logp = jax.nn.log_softmax(p_logits, -1)
    kl_BxT = (jnp.exp(logp) * (logp - jax.nn.log_softmax(q_logits, -1))).sum(-1)
    w_BxT = shift_left(batch["loss_mask"], 1)
    hit = jnp.argmax(q_logits, -1) == shift_left(batch["tokens"], 1)
    return weighted_mean(kl_BxT, w_BxT), {"acc_0": weighted_mean(hit, w_BxT),
                                          "tokens": batch["loss_mask"].sum()}

  def ranks_fn(trainable, frozen, batch):
    logits = drafter_logits(trainable, frozen, batch)
    r_BxT = rank_of(logits, shift_left(batch["tokens"], 1))  # r[q]: rank of x[q+1] at q
    return jnp.stack([shift_left(r_BxT, 1 + j) for j in range(steps)], axis=-1)

  def export(trainable, frozen):
    return nnx.merge(graphdef, trainable, frozen["drafter"])

  describe = {"drafter": "standalone", "target": [tcfg.vocab_size, tcfg.hidden_size,
                                                  tcfg.num_layers], "layers": list(layers)}
  return Objective(name="distill", trainable=trainable,
                   frozen={"drafter": frozen_drafter, "target": target_params},
                   loss_fn=loss_fn, ranks_fn=ranks_fn, export=export, describe=describe,
                   num_steps=steps, target_hidden_layers=())
