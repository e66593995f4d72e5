"""EAGLE-3 baseline objective: training-time test (TTT) with soft cross-entropy to the target.

Step j = 0 .. K-1 of the unroll, at row p (notation: vsd_jax/data.py):
  input token x[p + 1 + j], RoPE position p + j, cache slot j*T + p;
  hidden input: the target's fused features at p (j = 0) or the drafter's own out_hidden of
  step j-1 at row p (j > 0), exactly as a draft chain runs at decode time;
  attention: step-0 entries at positions <= p (the context, as the decoder's drafter cache
  holds it) plus this row's own entries of steps 1..j;
  label: the target's distribution of x[p + 2 + j] (its logits at p + 1 + j) restricted to the
  draft vocabulary and renormalised; weight loss_mask[p + 2 + j] * decay**j.
Input tokens are the data's, i.e. the target's greedy tokens: the path a chain follows while
its drafts are accepted (SpecForge's TTT does the same).

Loss = sum_j decay**j * mean_p CE_j (EAGLE-3's step weights, decay 0.8).
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Any, Callable

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.eagle3 import (Eagle3Config, Eagle3Drafter, draft_to_target_ids, init_eagle3,
                           reduced_vocab_map, set_vocab_map)
from models.kv_cache import KVCache
from models.llama import Decoder
from vsd_jax.vsd_diagnostics import tree_diagnostics_fn
from vsd_jax.objective_api import (Objective, cast_floats, rank_of, shift_left,
                                   target_hidden, weighted_mean)


def ttt_visibility(t: int, steps: int, step: int) -> jax.Array:
  """bool [T, K*T]: which cache slots row p of unroll step `step` attends to."""
  slot_step = jnp.arange(steps * t) // t
  slot_pos = jnp.arange(steps * t) % t
  p = jnp.arange(t)[:, None]
  context = (slot_step == 0)[None] & (slot_pos[None] <= p)
  own_chain = (slot_step >= 1)[None] & (slot_step <= step)[None] & (slot_pos[None] == p)
  return context | own_chain


def unroll(drafter: Eagle3Drafter, tokens_BxT, features_BxTxF, steps: int,
           extra_slots: int = 0):
  """The K-step TTT unroll (see the module docstring).

  Returns (draft logits float32 [K, B, T, Vd], step-0 out_hidden [B, T, D], the cache). The
  cache holds K*T slots (slot j*T + p: step j at row p) plus `extra_slots` unused ones after
  them, where VSD's draft paths (vsd_jax/draft_paths.py) attend to the step-0 context.
  """
  b, t = tokens_BxT.shape
  cache = KVCache.create(drafter.cfg.layer_config(), b, steps * t + extra_slots)
  pos_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
  hidden = features_BxTxF
  out, hidden0 = [], None
  for j in range(steps):  # K is small and static; each step has its own mask and shapes
    visible_TxS = jnp.pad(ttt_visibility(t, steps, j), ((0, 0), (0, extra_slots)))
    logits, hidden, cache = drafter(
        shift_left(tokens_BxT, 1 + j), hidden, pos_BxT + j, cache, slots_BxT=pos_BxT + j * t,
        visible_BxTxS=jnp.broadcast_to(visible_TxS, (b, t, steps * t + extra_slots)))
    out.append(logits)
    hidden0 = hidden if j == 0 else hidden0
  return jnp.stack(out), hidden0, cache


def target_draft_logits(target: Decoder, last_hidden_BxTxD, draft_target_ids_Vd):
  """The target's logits on the draft vocabulary only [B, T, Vd] (skips the full-vocab head)."""
  h = target.final_norm(last_hidden_BxTxD)
  w_VdxD = target.head_VxD()[draft_target_ids_Vd]
  return jnp.einsum("btd,vd->btv", h, w_VdxD.astype(h.dtype), preferred_element_type=jnp.float32)


@dataclasses.dataclass(frozen=True, eq=False)
class Eagle3Training:
  """What every objective over an EAGLE-3 drafter shares: its state, the TTT forward and loss.

  forward(trainable, frozen, batch, steps, extra_slots=0) -> (logits [K, B, T, Vd], step-0
    out_hidden [B, T, D], drafter cache, target hidden [B, T, 4, D], compute-dtype drafter).
  ttt_loss(logits, target hidden, drafter, frozen, batch) -> (the baseline loss, metrics).
  target_model(frozen) -> the frozen target Decoder (for forwards beyond the features).
  """

  ecfg: Eagle3Config
  trainable: Any
  frozen: dict
  forward: Callable
  ttt_loss: Callable
  ranks_fn: Callable
  export: Callable
  describe: dict
  eval_steps: int
  layers: tuple[int, ...]
  target_model: Callable


def eagle3_training(cfg, target: Decoder, token_counts_Vt: np.ndarray) -> Eagle3Training:
  """EAGLE-3 drafter for `target` with a frequency-ranked draft vocabulary from the counts."""
  tcfg = target.cfg
  ecfg = Eagle3Config.for_target(tcfg, draft_vocab_size=cfg.draft_vocab_size,
                                 fused_layers=cfg.fused_layers or None, dtype="float32")
  drafter = init_eagle3(ecfg, seed=cfg.seed, target=target)
  set_vocab_map(drafter, *reduced_vocab_map(token_counts_Vt, ecfg.draft_vocab_size))
  graphdef, trainable, frozen_drafter = nnx.split(
      drafter, nnx.All(nnx.Param, nnx.Not(nnx.PathContains("embed"))), ...)
  compute_graphdef = nnx.split(nnx.eval_shape(
      lambda: Eagle3Drafter(ecfg.with_dtype(cfg.dtype), nnx.Rngs(0))))[0]
  target_graphdef, target_params = nnx.split(target)
  layers = tuple(ecfg.fused_layers) + (tcfg.num_layers - 1,)
  steps, decay = cfg.ttt_steps, cfg.ttt_step_decay
  eval_steps = max(steps, cfg.eval_k, cfg.eval_tree[0])  # simulated tau may look further
  t2d_index_Vt = np.where(np.asarray(drafter.t2d[...]),
                          np.cumsum(np.asarray(drafter.t2d[...])) - 1, -1).astype(np.int32)
  frozen = {"drafter": frozen_drafter, "target": target_params,
            "t2d_index": jnp.asarray(t2d_index_Vt)}

  def forward(trainable, frozen, batch, steps=steps, extra_slots=0):
    hidden_BxTxNxD = target_hidden(target_graphdef, frozen["target"], batch, layers)
    model = nnx.merge(compute_graphdef, cast_floats(trainable, cfg.dtype),
                      cast_floats(frozen["drafter"], cfg.dtype))
    logits_KxBxTxVd, hidden0_BxTxD, cache = unroll(
        model, batch["tokens"], hidden_BxTxNxD[:, :, :3], steps, extra_slots)
    return logits_KxBxTxVd, hidden0_BxTxD, cache, hidden_BxTxNxD, model

  def ttt_loss(logits_KxBxTxVd, hidden_BxTxNxD, model, frozen, batch):
    ids_Vd = draft_to_target_ids(model.d2t[...], jnp.arange(ecfg.draft_vocab_size))
    tmodel = nnx.merge(target_graphdef, frozen["target"])
    tgt_BxTxVd = jax.lax.stop_gradient(target_draft_logits(tmodel, hidden_BxTxNxD[:, :, 3],
                                                           ids_Vd))
    metrics, total = {}, 0.0
    for j in range(steps):
      p_BxTxVd = jax.nn.softmax(shift_left(tgt_BxTxVd, 1 + j), axis=-1)
      logq = jax.nn.log_softmax(logits_KxBxTxVd[j], axis=-1)
      ce_BxT = -(p_BxTxVd * logq).sum(-1)
      w_BxT = shift_left(batch["loss_mask"], 2 + j)
      loss_j = weighted_mean(ce_BxT, w_BxT)
      total = total + decay ** j * loss_j
      hit = jnp.argmax(logits_KxBxTxVd[j], -1) == jnp.argmax(p_BxTxVd, -1)
      metrics[f"acc_{j}"] = weighted_mean(hit, w_BxT)
      metrics[f"loss_{j}"] = loss_j
    metrics["tokens"] = batch["loss_mask"].sum()
    return total, metrics

  def ranks_fn(trainable, frozen, batch):
    logits_KxBxTxVd = forward(trainable, frozen, batch, eval_steps)[0]
    out = []
    for j in range(eval_steps):
      data_BxT = shift_left(batch["tokens"], 2 + j)
      out.append(rank_of(logits_KxBxTxVd[j], frozen["t2d_index"][data_BxT]))
    return jnp.stack(out, axis=-1)

  def export(trainable, frozen):
    return nnx.merge(graphdef, trainable, frozen["drafter"])

  # The map comes from this data_dir's token counts and is not in the saved train state, so a
  # checkpoint must name the one its weights were trained against (t2d follows from d2t).
  vocab_map = hashlib.sha256(np.asarray(drafter.d2t[...], "<i8").tobytes()).hexdigest()
  describe = {"drafter": "eagle3", "target": [tcfg.vocab_size, tcfg.hidden_size, tcfg.num_layers],
              "draft_vocab_size": ecfg.draft_vocab_size, "fused_layers": list(ecfg.fused_layers),
              "ttt_steps": steps, "draft_vocab_map": vocab_map}
  return Eagle3Training(ecfg=ecfg, trainable=trainable, frozen=frozen, forward=forward,
                        ttt_loss=ttt_loss, ranks_fn=ranks_fn, export=export, describe=describe,
                        eval_steps=eval_steps, layers=layers,
                        target_model=lambda frozen: nnx.merge(target_graphdef, frozen["target"]))


def make_eagle3_objective(cfg, target: Decoder, token_counts_Vt: np.ndarray) -> Objective:
  """The EAGLE-3 baseline: the TTT loss alone (specs/vsd.md's L_div)."""
  e3 = eagle3_training(cfg, target, token_counts_Vt)

  def loss_fn(trainable, frozen, batch, rng):
    del rng
    logits_KxBxTxVd, _, _, hidden_BxTxNxD, model = e3.forward(trainable, frozen, batch)
    return e3.ttt_loss(logits_KxBxTxVd, hidden_BxTxNxD, model, frozen, batch)

  return Objective(name="eagle3_ttt", trainable=e3.trainable, frozen=e3.frozen,
                   loss_fn=loss_fn, ranks_fn=e3.ranks_fn, export=e3.export,
                   describe=e3.describe, num_steps=e3.eval_steps, target_hidden_layers=e3.layers,
                   diagnostics_fn=tree_diagnostics_fn(cfg, e3))
