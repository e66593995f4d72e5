"""Medusa baseline objective: head m at row p learns the target's token at p + 2 + m.

Inputs are the frozen target's last hidden state after its final norm (models/medusa.py);
labels are the data tokens, which are the target's own greedy tokens (Medusa-1 trains on
labels[2 + m:] with cross-entropy). Loss = sum_m decay**m * mean CE_m (decay: ttt_step_decay).
"""

from __future__ import annotations

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.llama import Decoder
from models.medusa import MedusaConfig, init_medusa, medusa_logits
from vsd_jax.objective_api import (Objective, cast_floats, rank_of, shift_left,
                                   target_hidden, weighted_mean)


def make_medusa_objective(cfg, target: Decoder, token_counts_Vt: np.ndarray) -> Objective:
  del token_counts_Vt
  tcfg = target.cfg
  mcfg = MedusaConfig(hidden_size=tcfg.hidden_size, vocab_size=tcfg.vocab_size,
                      num_heads=cfg.medusa_heads, dtype="float32")
  heads = init_medusa(mcfg, seed=cfg.seed)
  graphdef, trainable = nnx.split(heads)
  target_graphdef, target_params = nnx.split(target)
  layers = (tcfg.num_layers - 1,)
  m_heads, decay = cfg.medusa_heads, cfg.ttt_step_decay

  def forward(trainable, frozen, batch):
    tmodel = nnx.merge(target_graphdef, frozen["target"])
    h_BxTxD = tmodel.final_norm(target_hidden(target_graphdef, frozen["target"], batch,
                                              layers)[:, :, 0])
    return medusa_logits(cast_floats(trainable, cfg.dtype), h_BxTxD, tmodel.head_VxD())

  def loss_fn(trainable, frozen, batch, rng):
    del rng
    logits_BxTxMxV = forward(trainable, frozen, batch)
    metrics, total = {}, 0.0
    for m in range(m_heads):
      labels_BxT = shift_left(batch["tokens"], 2 + m)
      logits = logits_BxTxMxV[:, :, m]
      ce_BxT = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
          logits, labels_BxT[..., None], -1)[..., 0]
      w_BxT = shift_left(batch["loss_mask"], 2 + m)
      loss_m = weighted_mean(ce_BxT, w_BxT)
      total = total + decay ** m * loss_m
      metrics[f"acc_{m}"] = weighted_mean(jnp.argmax(logits, -1) == labels_BxT, w_BxT)
      metrics[f"loss_{m}"] = loss_m
    metrics["tokens"] = batch["loss_mask"].sum()
    return total, metrics

  def ranks_fn(trainable, frozen, batch):
    logits_BxTxMxV = forward(trainable, frozen, batch)
    return jnp.stack([rank_of(logits_BxTxMxV[:, :, m], shift_left(batch["tokens"], 2 + m))
                      for m in range(m_heads)], axis=-1)

  def export(trainable, frozen):
    del frozen
    return nnx.merge(graphdef, trainable)

  describe = {"drafter": "medusa", "target": [tcfg.vocab_size, tcfg.hidden_size, tcfg.num_layers],
              "medusa_heads": m_heads}
  return Objective(name="medusa", trainable=trainable, frozen={"target": target_params},
                   loss_fn=loss_fn, ranks_fn=ranks_fn, export=export, describe=describe,
                   num_steps=m_heads, target_hidden_layers=layers)
