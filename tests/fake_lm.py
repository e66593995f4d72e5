"""A fake language model for engine tests: it predicts (last token + 1) mod V.

Like the flax lm1b sampler's test model, it makes decode-loop behaviour exactly predictable
without any weights. The "cache" records which token sits in each slot so tests can check that
writes land where they should.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asd_jax.lm_api import LanguageModelFns


def fake_lm(vocab_size: int = 32, nan_after_position: int | None = None,
            shift: int = 1) -> LanguageModelFns:
  """Logits put mass 10 on (token + shift) % V; optional NaN logits at positions >= n."""

  def logits_for(tokens, positions):
    logits = 10.0 * jax.nn.one_hot((tokens + shift) % vocab_size, vocab_size)
    if nan_after_position is not None:
      logits = jnp.where((positions >= nan_after_position)[..., None], jnp.nan, logits)
    return logits

  def forward(params, tokens_BxT, positions_BxT, cache):
    del params
    rows = jnp.arange(tokens_BxT.shape[0])[:, None]
    cache = cache.at[rows, positions_BxT].set(tokens_BxT, mode="drop")
    return logits_for(tokens_BxT, positions_BxT), None, cache

  def prefill(params, tokens_BxT, lengths_B, cache):
    b, t = tokens_BxT.shape
    positions = jnp.broadcast_to(jnp.arange(t), (b, t))
    logits, _, cache = forward(params, tokens_BxT, positions, cache)
    last = jnp.take_along_axis(logits, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    return last, None, cache

  def init_cache(batch_size, capacity):
    return jnp.full((batch_size, capacity), -1, jnp.int32)

  return LanguageModelFns(forward=forward, prefill=prefill, init_cache=init_cache,
                          vocab_size=vocab_size, name="fake")
