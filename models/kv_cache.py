"""Preallocated KV cache for the Llama-family decoder.

Shape notation (used across models/): B batch rows, T new tokens in a step, S cache capacity
(slots), L layers, K kv heads, H head dim, D model width, V vocab.

The cache is a pytree of per-layer buffers: keys `k[l]` [B, K, H, S] and values `v[l]`
[B, K, S, H]. Keys are stored transposed because that is the layout the query-key dot reads
(scores = q @ k over H, for every slot); stored [B, K, S, H], XLA transposes the whole key
buffer of every layer at every decode step. Values are already in the layout the
probabilities-value dot reads.

The cache holds no cursor: the caller passes, for every new token, the slot it is written to
(`slots_BxT`), and the attention mask is built from slots and positions. With the chain layout
slot == position, so a row's committed length *is* its cursor and rejection is a cursor rewind
in the caller: stale entries past the cursor are never visible, because a query at position p
only sees slots <= p and every slot in (cursor, p] is rewritten by the same forward before it is
read.

Writes to slots >= S are dropped (scatter mode="drop"), never clamped onto valid entries; the
decode engines refuse requests that could need them before running.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from models.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  k: tuple[jax.Array, ...]  # L x [B, K, H, S]
  v: tuple[jax.Array, ...]  # L x [B, K, S, H]

  @property
  def capacity(self) -> int:
    return self.v[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.v[0].shape[0]

  @classmethod
  def create(cls, cfg: ModelConfig, batch_size: int, capacity: int) -> "KVCache":
    b, kvh, h, dtype = batch_size, cfg.num_kv_heads, cfg.head_dim, jnp.dtype(cfg.dtype)
    return cls(k=tuple(jnp.zeros((b, kvh, h, capacity), dtype) for _ in range(cfg.num_layers)),
               v=tuple(jnp.zeros((b, kvh, capacity, h), dtype) for _ in range(cfg.num_layers)))


def write_keys(buf_BxKxHxS: jax.Array, new_BxTxKxH: jax.Array, slots_BxT: jax.Array) -> jax.Array:
  """Scatters new keys into their slots; out-of-range slots are dropped, not clamped."""
  rows_Bx1 = jnp.arange(buf_BxKxHxS.shape[0])[:, None]
  # Advanced indices on axes 0 and 3 around two slices: the indexed view is [B, T, K, H].
  return buf_BxKxHxS.at[rows_Bx1, :, :, slots_BxT].set(
      new_BxTxKxH.astype(buf_BxKxHxS.dtype), mode="drop")


def write_values(buf_BxKxSxH: jax.Array, new_BxTxKxH: jax.Array, slots_BxT: jax.Array
                 ) -> jax.Array:
  """Scatters new values into their slots; out-of-range slots are dropped, not clamped."""
  rows_Bx1 = jnp.arange(buf_BxKxSxH.shape[0])[:, None]
  # Advanced indices on axes 0 and 2 around a slice: the indexed view is [B, T, K, H].
  return buf_BxKxSxH.at[rows_Bx1, :, slots_BxT].set(
      new_BxTxKxH.astype(buf_BxKxSxH.dtype), mode="drop")


def move_slots(cache: KVCache, src_BxA: jax.Array, dst_BxA: jax.Array) -> KVCache:
  """Copies every layer's entries at `src` slots to `dst` slots; dst >= S is dropped.

  All entries are gathered before any is written, so overlapping moves (compacting an
  accepted tree path towards lower slots) are safe.
  """
  rows_Bx1 = jnp.arange(cache.batch_size)[:, None]
  src_BxA = jnp.clip(src_BxA, 0, cache.capacity - 1)

  def move_keys(buf_BxKxHxS):
    return write_keys(buf_BxKxHxS, buf_BxKxHxS[rows_Bx1, :, :, src_BxA], dst_BxA)

  def move_values(buf_BxKxSxH):
    return write_values(buf_BxKxSxH, buf_BxKxSxH[rows_Bx1, :, src_BxA], dst_BxA)

  return KVCache(k=tuple(move_keys(k) for k in cache.k), v=tuple(move_values(v) for v in cache.v))
