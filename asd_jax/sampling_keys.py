"""PRNG keys per request: every random draw a row makes comes from its own key only.

The decode engines hold one key per row (`row_keys`), split it each round (`split_keys`) and
draw with `categorical_rows`, so a request's sampled output does not depend on which other
requests share its batch, nor on its place in it. One key for a whole batch is still accepted
everywhere (the verification rules' public form).

Shape notation: B rows, M draws per row, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_row_keys(rng) -> bool:
  """True for a key per row (a typed key array [B]); False for one key for the whole batch."""
  return jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) and rng.ndim == 1


def split_keys(rng: jax.Array, num: int) -> jax.Array:
  """`jax.random.split` that also splits a key per row: [num] + rng's batch shape."""
  if is_row_keys(rng):
    return jax.vmap(lambda key: jax.random.split(key, num), out_axes=1)(rng)
  return jax.random.split(rng, num)


def categorical_rows(rng, logits_BxMxV: jax.Array, num: int | None = None) -> jax.Array:
  """int32 draws from softmax(logits) over the last axis: [B, M] (num None) or [num, B, M].

  With a key per row, row b's draws use only rng[b] (batch-independent); else one key.
  """
  shape = None if num is None else (num,) + logits_BxMxV.shape[:-1]
  if not is_row_keys(rng):
    return jax.random.categorical(rng, logits_BxMxV, axis=-1, shape=shape).astype(jnp.int32)
  if logits_BxMxV.ndim < 2 or rng.shape[0] != logits_BxMxV.shape[0]:
    raise ValueError(f"a key per row needs one key for each of the logits' rows: got "
                     f"{rng.shape[0]} keys for logits of shape {tuple(logits_BxMxV.shape)}")
  row = lambda key, z: jax.random.categorical(
      key, z, axis=-1, shape=None if num is None else (num,) + z.shape[:-1])
  return jax.vmap(row, out_axes=0 if num is None else 1)(rng, logits_BxMxV).astype(jnp.int32)


_MAX_SEED = 2 ** 32


@jax.jit
def _row_keys(seeds_B, stream_B):
  return jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(seeds_B, stream_B)


def row_keys(seed, batch: int) -> jax.Array:
  """One PRNG key per request, key array [B], from `seed`: an int, or int[B] (one per request).

  With int[B], row b's key depends only on seed[b]: a request sampled with seed s gives the
  same output alone or in any batch. An int s is shorthand for distinct streams: row b gets
  the key of stream b of s, and row 0 equals the request run alone with seed s.
  """
  if isinstance(seed, jax.Array) and (jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key)
                                      or seed.dtype == jnp.uint32):
    # A raw key (jax.random.PRNGKey(42) is uint32 [0, 42]) would be read as two per-row seeds
    # for a batch of 2, and a typed key fails inside numpy without naming `seed`.
    raise TypeError(f"seed takes integer seeds, not a JAX PRNG key (got a {seed.dtype} array "
                    f"of shape {seed.shape}): pass an int or int[{batch}] (one per request), "
                    f"as Python or numpy integers")
  seeds = np.asarray(seed)
  if not np.issubdtype(seeds.dtype, np.integer) or seeds.dtype == np.bool_:
    raise TypeError(f"seed must be an int or int[{batch}] (one per request), got {seed!r}")
  if seeds.ndim == 0:
    seeds_B, stream_B = np.full((batch,), seeds), np.arange(batch)
  elif seeds.shape == (batch,):
    seeds_B, stream_B = seeds, np.zeros((batch,), np.int64)
  else:
    raise ValueError(f"seed must be an int or int[{batch}] (one per request), got shape "
                     f"{seeds.shape}")
  if seeds_B.size and (seeds_B.min() < 0 or seeds_B.max() >= _MAX_SEED):
    raise ValueError(f"seed must be in [0, 2**32), got {seeds_B.min()}..{seeds_B.max()}")
  return _row_keys(jnp.asarray(seeds_B.astype(np.uint32)), jnp.asarray(stream_B, jnp.uint32))
