"""Preallocated KV cache for the Llama-family decoder.

Shape notation (used across models/): B batch rows, T new tokens in a step, S cache capacity
(slots), L layers, K kv heads, H head dim, D model width, V vocab.

The cache is a pytree of per-layer buffers `k[l]`, `v[l]`: [B, K, S, H]. It holds no cursor:
the caller passes, for every new token, the slot it is written to (`slots_BxT`), and the
attention mask is built from slots and positions. With the chain layout slot == position, so a
row's committed length *is* its cursor and rejection is a cursor rewind in the caller: stale
entries past the cursor are never visible, because a query at position p only sees slots <= p
and every slot in (cursor, p] is rewritten by the same forward before it is read.

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
  k: tuple[jax.Array, ...]  # L x [B, K, S, H]
  v: tuple[jax.Array, ...]

  @property
  def capacity(self) -> int:
    return self.k[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.k[0].shape[0]

  @classmethod
  def create(cls, cfg: ModelConfig, batch_size: int, capacity: int) -> "KVCache":
    shape = (batch_size, cfg.num_kv_heads, capacity, cfg.head_dim)
    dtype = jnp.dtype(cfg.dtype)
    zeros = lambda: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    return cls(k=zeros(), v=zeros())


def write_kv(buf_BxKxSxH: jax.Array, new_BxTxKxH: jax.Array, slots_BxT: jax.Array) -> jax.Array:
  """Scatters new entries into their slots; out-of-range slots are dropped, not clamped."""
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

  def move(buf_BxKxSxH):
    moved_BxAxKxH = buf_BxKxSxH[rows_Bx1, :, jnp.clip(src_BxA, 0, buf_BxKxSxH.shape[2] - 1)]
    return buf_BxKxSxH.at[rows_Bx1, :, dst_BxA].set(moved_BxAxKxH, mode="drop")

  return KVCache(k=tuple(move(k) for k in cache.k), v=tuple(move(v) for v in cache.v))
