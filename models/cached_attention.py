"""Attention of T new tokens over a KV cache, and the cache write, in the order decode loops need.

Shape notation: see models/kv_cache.py (B, T, S, K kv heads, G query heads per kv head, H).

Two orders, chosen statically by T (`block_mask` derives what each query may see once per
forward, and every layer reuses it):

- Short blocks (T <= SHORT_BLOCK: decode steps, verification blocks, draft trees) attend to the
  cache *as it was* plus the new block's own keys and values, one softmax over both, and write
  the new entries afterwards. Inside a `lax.while_loop` the cache is then read before it is
  written, so XLA updates it in place. Writing first and attending over the updated buffer
  makes XLA copy every layer's buffers (two copies each per step on CPU, more in each branch of
  a `lax.switch`): a SmolLM2-135M plain step went from 32.7 to 28-29 ms without them
  (docs/bench/kv_in_place).
- Longer blocks (prefill, training forwards) write first and attend over the cache: no extra
  T x T scores, and no loop to copy in.

Both see exactly the same entries: for query t, a cache slot is visible where `visible_BxTxS`
says so, and the new token j is visible where the mask marks j's slot. A slot that the block
rewrites is read from the block, never from its stale cache entry (and from the block's last write
to it, if it writes it twice); a new token whose slot is outside the cache is never visible (its
write is dropped).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from models.block_attention import (MASKED_SCORE, attention_scores, block_attention, group_queries,
                                    ungroup)
from models.kv_cache import write_keys, write_values

SHORT_BLOCK = 32


class BlockMask(NamedTuple):
  """What a block's T queries may attend to: derived once per forward, shared by every layer."""

  visible_BxTxS: jax.Array  # over cache slots, as they are after the block's writes
  old_visible_BxTxS: jax.Array | None  # short blocks: over the cache as it was
  new_visible_BxTxT: jax.Array | None  # short blocks: over the block's own entries


def block_mask(slots_BxT: jax.Array, visible_BxTxS: jax.Array, capacity: int) -> BlockMask:
  """The mask cached_attention needs for a block written at `slots_BxT`; for short blocks it
  splits `visible_BxTxS` into the cache entries the block leaves and the block's own."""
  b, t = slots_BxT.shape
  if t > SHORT_BLOCK:
    return BlockMask(visible_BxTxS, None, None)
  rows_Bx1 = jnp.arange(b)[:, None]
  rewritten_BxS = jnp.zeros((b, capacity), bool).at[rows_Bx1, slots_BxT].set(True, mode="drop")
  # A slot written twice in one block (a draft window clamped at position 0 repeats it) holds
  # its last write afterwards; only that entry is visible, as it would be after the write.
  j_T = jnp.arange(t)
  superseded_BxT = ((slots_BxT[:, None, :] == slots_BxT[:, :, None])
                    & (j_T[None, :, None] > j_T[None, None, :])).any(axis=1)
  in_cache_BxT = (slots_BxT >= 0) & (slots_BxT < capacity) & ~superseded_BxT
  new_visible_BxTxT = in_cache_BxT[:, None, :] & jnp.take_along_axis(
      visible_BxTxS,
      jnp.broadcast_to(jnp.clip(slots_BxT, 0, capacity - 1)[:, None, :], (b, t, t)), axis=2)
  return BlockMask(visible_BxTxS, visible_BxTxS & ~rewritten_BxS[:, None, :], new_visible_BxTxT)


def cached_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                     slots_BxT, mask: BlockMask):
  """Returns (attention output [B, T, N*H], updated key cache, updated value cache)."""
  order = write_then_attend if mask.new_visible_BxTxT is None else attend_then_write
  return order(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH, slots_BxT,
               mask)


def write_then_attend(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                      slots_BxT, mask: BlockMask):
  """The long-block order (same arguments and results as cached_attention)."""
  k_cache_BxKxHxS = write_keys(k_cache_BxKxHxS, k_BxTxKxH, slots_BxT)
  v_cache_BxKxSxH = write_values(v_cache_BxKxSxH, v_BxTxKxH, slots_BxT)
  q_BxKxGxTxH = group_queries(q_BxTxNxH, k_BxTxKxH.shape[2])
  scores = jnp.where(mask.visible_BxTxS[:, None, None], attention_scores(q_BxKxGxTxH, k_cache_BxKxHxS),
                     MASKED_SCORE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_cache_BxKxSxH.dtype)
  out_BxKxGxTxH = jnp.einsum("bkgts,bksh->bkgth", probs, v_cache_BxKxSxH)
  return ungroup(out_BxKxGxTxH), k_cache_BxKxHxS, v_cache_BxKxSxH


def attend_then_write(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                      slots_BxT, mask: BlockMask):
  """The short-block order (same arguments and results as cached_attention; `mask` from
  block_mask of a short block)."""
  out_BxTxNH = block_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                               mask.old_visible_BxTxS, mask.new_visible_BxTxT)
  return (out_BxTxNH, write_keys(k_cache_BxKxHxS, k_BxTxKxH, slots_BxT),
          write_values(v_cache_BxKxSxH, v_BxTxKxH, slots_BxT))
