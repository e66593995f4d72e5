"""The VSD objective (specs/vsd.md) over an EAGLE-3 drafter: `--objective=vsd`.

    L = lambda_div * L_div + lambda_wl * L_WL + lambda_car * L_CAR

L_div is the baseline's TTT loss (vsd_jax/eagle3_ttt.py), computed on the same unroll whose
cache the E-step reuses. Per step:

E-step (no gradient through the choices): P context rows per sequence are sampled among
those with a response token at p + 2; from each, the drafter grows S paths of depth d
(vsd_jax/draft_paths.py; `vsd_proposal` tree or iid). The oracle is the data itself: the
training data is the target's greedy text, so the target's greedy continuation from p is the
data's next d tokens and needs no extra target forward (`vsd_oracle=data`; for other data,
`vsd_oracle=target` asks the target about every path prefix: vsd_jax/target_oracle.py). Each path keeps its accepted prefix
and its first rejected token is replaced by the oracle token (vsd_jax/vsd_paths.py); utility
U_s = the accepted length (`vsd_utility=expected`, target oracle only: the expected number of
tokens speculative sampling at temperature 1 accepts, sum_j prod_{i<=j} min(1, p/q));
w = softmax_s(eta * U).

M-step: L_WL = - sum_s w~_s sum_j log q(z~_j | x, z~_<j) with ARW's w~ = w - c * mean(w),
c = sg(the drafter's mean max-probability over the S paths' nodes); L_CAR = the unlikelihood
penalty on rejected draft tokens with q > gamma. Both are means over sampled positions.

`vsd_continue` (spec step 3's option, off by default): every corrected path goes on with the
target's greedy path to depth d. Under greedy acceptance that makes all S corrected paths the
oracle's own d tokens, so L_WL becomes (sum_s w~_s) = (1 - c) times the hard negative
log-likelihood of the data's next d tokens along the drafter's own chain (a forced rollout):
the path weights no longer matter, and the term is a one-hot TTT-like loss to depth d next to
L_div's soft one. It needs the target's continuation, which only `vsd_oracle=data` has.

Special case (documented, tested): S = 1, ARW and CAR off. Then w = 1 and L_WL is the hard
(one-hot) negative log-likelihood of the first l + 1 oracle tokens along the drafter's own
states, where l is how many tokens the single proposal got accepted: a token-level TTT loss
truncated at a sampled acceptance length.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models.llama import Decoder
from vsd_jax.draft_paths import oracle_tokens, rollout, sample_positions
from vsd_jax.eagle3_ttt import eagle3_training
from vsd_jax.objective_api import Objective
from vsd_jax.target_oracle import target_verdicts
from vsd_jax.vsd_diagnostics import tree_diagnostics_fn
from vsd_jax.vsd_paths import (arw_weights, car_penalty, continued_keep, corrected_paths,
                               expected_accepted_length, path_weights, rejected_tokens,
                               weighted_path_nll)


def vsd_terms(paths, oracle_BxPxd, pos_valid_BxP, cfg, oracle_chain=None,
              target_logp=None) -> dict[str, jax.Array]:
  """Per-position L_WL and L_CAR [B, P] and E-step statistics from proposals and the oracle.

  oracle_chain: with `vsd_continue`, the drafter's states along the oracle's own tokens (a
  `forced` rollout with S = 1), which score the continued corrected paths.
  target_logp: with `vsd_utility=expected`, the target's log-probability of every path token
  [B, P, S, d] (vsd_jax/target_oracle.py `target_verdicts`).
  """
  valid = paths.valid & pos_valid_BxP[..., None]
  corrected, keep, length = corrected_paths(paths.tokens, oracle_BxPxd)
  if cfg.vsd_continue:
    keep = jnp.broadcast_to(continued_keep(oracle_BxPxd)[..., None, :], keep.shape)
    logq_corrected = jnp.broadcast_to(oracle_chain.log_prob(oracle_BxPxd[..., None, :]),
                                      keep.shape)
  else:
    logq_corrected = paths.log_prob(corrected)
  keep = keep & valid[..., None]
  logq_drafts = paths.log_prob(paths.tokens)
  utility = length
  if cfg.vsd_utility == "expected":
    utility = jax.lax.stop_gradient(expected_accepted_length(target_logp, logq_drafts))
  weights = path_weights(utility, valid, cfg.vsd_eta)
  max_prob = paths.max_prob()
  node_ok = jnp.broadcast_to(valid[..., None], keep.shape)
  confidence = jax.lax.stop_gradient(
      jnp.where(node_ok, max_prob, 0.0).sum((-1, -2))
      / jnp.maximum(node_ok.sum((-1, -2)), 1))
  if cfg.vsd_arw:
    weights = arw_weights(weights, confidence, valid)
  wl = weighted_path_nll(logq_corrected, keep, weights)
  _, is_rejected = rejected_tokens(paths.tokens, oracle_BxPxd, length)
  at = jnp.minimum(length, paths.tokens.shape[-1] - 1)  # the rejected depth (if any)
  q_rejected = jnp.exp(jnp.take_along_axis(logq_drafts, at[..., None],
                                           axis=-1)[..., 0])
  car = car_penalty(q_rejected, is_rejected & valid, cfg.vsd_gamma)
  return {"wl": wl, "car": car, "length": length, "valid": valid, "confidence": confidence}


def make_vsd_objective(cfg, target: Decoder, token_counts_Vt: np.ndarray) -> Objective:
  if cfg.drafter != "eagle3":
    raise ValueError(f"--objective=vsd trains EAGLE-3 drafters (specs/vsd.md); preset "
                     f"{cfg.name!r} has drafter={cfg.drafter!r}")
  e3 = eagle3_training(cfg, target, token_counts_Vt)
  path_slots = (cfg.vsd_depth - 1) * cfg.vsd_positions * cfg.vsd_paths
  chain_slots = (cfg.vsd_depth - 1) * cfg.vsd_positions if cfg.vsd_continue else 0
  extra = path_slots + chain_slots
  if cfg.vsd_positions > cfg.seq_len:
    raise ValueError(f"vsd_positions={cfg.vsd_positions} exceeds seq_len={cfg.seq_len}")
  if cfg.seq_len <= cfg.vsd_depth + 1:  # the oracle reads d tokens past a context position
    raise ValueError(f"seq_len={cfg.seq_len} leaves vsd_depth={cfg.vsd_depth} no oracle "
                     f"tokens; raise seq_len or lower vsd_depth")

  def loss_fn(trainable, frozen, batch, rng):
    logits_KxBxTxVd, hidden0, cache, hidden_BxTxNxD, model = e3.forward(
        trainable, frozen, batch, extra_slots=extra)
    div, metrics = e3.ttt_loss(logits_KxBxTxVd, hidden_BxTxNxD, model, frozen, batch)
    k_pos, k_paths = jax.random.split(rng)
    rows, pos_valid = sample_positions(k_pos, batch["loss_mask"], cfg.vsd_positions)
    t = batch["tokens"].shape[1]
    paths = rollout(model, cache, context_len=t, first_free_slot=cfg.ttt_steps * t,
                    logits0_BxTxVd=logits_KxBxTxVd[0], hidden0_BxTxD=hidden0, rows_BxP=rows,
                    num_paths=cfg.vsd_paths, depth=cfg.vsd_depth, proposal=cfg.vsd_proposal,
                    top_k=cfg.vsd_top_k, key=k_paths)
    target_logp = None
    if cfg.vsd_oracle == "target":
      oracle, target_logp = jax.lax.stop_gradient(target_verdicts(
          e3.target_model(frozen), batch["tokens"], rows, paths.tokens, model.d2t[...],
          frozen["t2d_index"]))
    else:
      oracle = oracle_tokens(batch["tokens"], batch["loss_mask"], frozen["t2d_index"], rows,
                             cfg.vsd_depth)
    chain = None
    if cfg.vsd_continue:
      chain = rollout(model, cache, context_len=t,
                      first_free_slot=cfg.ttt_steps * t + path_slots,
                      logits0_BxTxVd=logits_KxBxTxVd[0], hidden0_BxTxD=hidden0, rows_BxP=rows,
                      num_paths=1, depth=cfg.vsd_depth, proposal="forced", top_k=1,
                      key=k_paths, forced_BxPxd=oracle)
    terms = vsd_terms(paths, oracle, pos_valid, cfg, chain, target_logp)
    n = jnp.maximum(pos_valid.sum(), 1)
    wl = jnp.where(pos_valid, terms["wl"], 0.0).sum() / n
    car = jnp.where(pos_valid, terms["car"], 0.0).sum() / n
    total = cfg.vsd_lambda_div * div + cfg.vsd_lambda_wl * wl
    if cfg.vsd_car:
      total = total + cfg.vsd_lambda_car * car
    paths_ok = jnp.maximum(terms["valid"].sum(), 1)
    metrics.update(
        loss_div=div, loss_wl=wl, loss_car=car,
        vsd_utility=jnp.where(terms["valid"], terms["length"], 0).sum() / paths_ok,
        vsd_best_utility=jnp.where(pos_valid, jnp.where(terms["valid"], terms["length"], 0)
                                   .max(-1), 0).sum() / n,
        vsd_confidence=jnp.where(pos_valid, terms["confidence"], 0.0).sum() / n)
    return total, metrics

  describe = {**e3.describe, "objective": "vsd",
              **{k: getattr(cfg, k) for k in ("vsd_paths", "vsd_depth", "vsd_top_k",
                                               "vsd_proposal", "vsd_oracle", "vsd_positions", "vsd_eta",
                                               "vsd_utility",
                                               "vsd_arw", "vsd_car", "vsd_gamma", "vsd_continue",
                                               "vsd_lambda_div", "vsd_lambda_wl",
                                               "vsd_lambda_car")}}
  return Objective(name="vsd", trainable=e3.trainable, frozen=e3.frozen, loss_fn=loss_fn,
                   ranks_fn=e3.ranks_fn, export=e3.export, describe=describe,
                   num_steps=e3.eval_steps, target_hidden_layers=e3.layers,
                   diagnostics_fn=tree_diagnostics_fn(cfg, e3))
