"""Wraps the NNX `Decoder` as the engines' `LanguageModelFns` (split outside jit, merge inside)."""

from __future__ import annotations

import flax.nnx as nnx
import jax.numpy as jnp

from asd_jax.lm_api import LanguageModelFns
from asd_jax.request_checks import param_shapes
from models.kv_cache import KVCache, move_slots
from models.llama import Decoder


def decoder_fns(model: Decoder, hidden_layers: tuple[int, ...] = (), name: str = "decoder"):
  """Returns (fns, params): pure callables over the decoder and its state pytree."""
  graphdef, params = nnx.split(model)
  cfg = model.cfg

  def forward(params, tokens_BxT, positions_BxT, cache):
    return nnx.merge(graphdef, params)(tokens_BxT, positions_BxT, cache,
                                       hidden_layers=hidden_layers)

  def prefill(params, tokens_BxT, lengths_B, cache):
    b, t = tokens_BxT.shape
    positions_BxT = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    logits_Bx1xV, hidden, cache = nnx.merge(graphdef, params)(
        tokens_BxT, positions_BxT, cache, hidden_layers=hidden_layers,
        logits_at_BxR=(lengths_B - 1)[:, None])
    return logits_Bx1xV[:, 0], hidden, cache

  def init_cache(batch_size: int, capacity: int) -> KVCache:
    return KVCache.create(cfg, batch_size, capacity)

  def tree_forward(params, tokens_BxT, positions_BxT, slots_BxT, visible_BxTxS, cache):
    return nnx.merge(graphdef, params)(tokens_BxT, positions_BxT, cache, slots_BxT=slots_BxT,
                                       visible_BxTxS=visible_BxTxS,
                                       hidden_layers=hidden_layers)

  fns = LanguageModelFns(forward=forward, prefill=prefill, init_cache=init_cache,
                         vocab_size=cfg.vocab_size, name=name,
                         max_positions=cfg.max_position_embeddings, tree_forward=tree_forward,
                         move_slots=move_slots, param_shapes=param_shapes(params))
  return fns, params
