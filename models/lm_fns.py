"""Wraps the NNX `Decoder` as the engines' `LanguageModelFns` (split outside jit, merge inside)."""

from __future__ import annotations

import functools

import flax.nnx as nnx
import jax.numpy as jnp

from asd_jax.lm_api import LanguageModelFns
from asd_jax.request_checks import ParamShapes, param_shapes
from models.config import ModelConfig
from models.kv_cache import KVCache, move_slots
from models.llama import Decoder


# Functions built for one decoder architecture are kept and handed out again: the decode loops
# take them as static arguments compared by identity, so a caller that calls decoder_fns per
# request (a server handler, a CLI called in-process) would otherwise compile the whole loop again
# each time, and every drafter built from them (asd_jax.drafter_api.DRAFTERS_KEPT) with it.
# They hold only the graph definition (no weights: those are the params), so keeping a few is
# cheap.
ARCHITECTURES_KEPT = 16


def decoder_fns(model: Decoder, hidden_layers: tuple[int, ...] = (), name: str = "decoder"):
  """Returns (fns, params): pure callables over the decoder and its state pytree.

  Two decoders of the same architecture (equal graph definitions, e.g. the same model loaded
  twice, or two seeds of one config) with the same `hidden_layers` and `name` get the same fns
  object, so programs compiled for one serve the other (ARCHITECTURES_KEPT)."""
  graphdef, params = nnx.split(model)
  return _decoder_fns(graphdef, model.cfg, tuple(hidden_layers), name,
                      param_shapes(params)), params


@functools.lru_cache(maxsize=ARCHITECTURES_KEPT)
def _decoder_fns(graphdef: nnx.GraphDef, cfg: ModelConfig, hidden_layers: tuple[int, ...],
                 name: str, shapes: ParamShapes) -> LanguageModelFns:
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

  return LanguageModelFns(forward=forward, prefill=prefill, init_cache=init_cache,
                          vocab_size=cfg.vocab_size, name=name,
                          max_positions=cfg.max_position_embeddings, tree_forward=tree_forward,
                          move_slots=move_slots, param_shapes=shapes)
