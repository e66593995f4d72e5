"""Attention of a short block over the KV cache as it was plus the block's own entries.

The computation `attend_then_write` (models/cached_attention.py) needs: for each of the T new
queries, one softmax over the visible cache slots (`old_visible_BxTxS`) and the visible new
entries (`new_visible_BxTxT`), then the probabilities times the values. `reference_attention`
is the XLA version. For float32 on the CPU, `block_attention` runs it as one native call per
layer (models/native/block_attention.cc) that reads only up to each query's last visible slot
instead of a dozen small XLA ops over the whole allocated cache (SmolLM2 decode step, capacity
448: ~2.5 ms of attention ops). Gradients are the reference's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.native_kernels import TARGETS, native_available

_F32 = jnp.float32
MASKED_SCORE = -1e30  # finite so fully masked rows (padding) give uniform, not NaN, weights


def attention_scores(q_BxKxGxTxH, keys_BxKxHxS):
  return jnp.einsum("bkgth,bkhs->bkgts", q_BxKxGxTxH, keys_BxKxHxS,
                    preferred_element_type=_F32) * (q_BxKxGxTxH.shape[-1] ** -0.5)


def group_queries(q_BxTxNxH, num_kv_heads: int):
  b, t, n, h = q_BxTxNxH.shape
  return q_BxTxNxH.reshape(b, t, num_kv_heads, n // num_kv_heads, h).transpose(0, 2, 3, 1, 4)


def ungroup(out_BxKxGxTxH):
  b, k, g, t, h = out_BxKxGxTxH.shape
  return out_BxKxGxTxH.transpose(0, 3, 1, 2, 4).reshape(b, t, k * g * h)


def reference_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                        old_visible_BxTxS, new_visible_BxTxT):
  """Attention output [B, T, N*H] (XLA ops)."""
  s = v_cache_BxKxSxH.shape[2]
  q_BxKxGxTxH = group_queries(q_BxTxNxH, k_BxTxKxH.shape[2])
  new_keys_BxKxHxT = k_BxTxKxH.astype(k_cache_BxKxHxS.dtype).transpose(0, 2, 3, 1)
  scores = jnp.concatenate([
      jnp.where(old_visible_BxTxS[:, None, None], attention_scores(q_BxKxGxTxH, k_cache_BxKxHxS),
                MASKED_SCORE),
      jnp.where(new_visible_BxTxT[:, None, None], attention_scores(q_BxKxGxTxH, new_keys_BxKxHxT),
                MASKED_SCORE)], axis=-1)
  probs = jax.nn.softmax(scores, axis=-1).astype(v_cache_BxKxSxH.dtype)
  new_values_BxKxTxH = v_BxTxKxH.astype(v_cache_BxKxSxH.dtype).transpose(0, 2, 1, 3)
  out_BxKxGxTxH = (jnp.einsum("bkgts,bksh->bkgth", probs[..., :s], v_cache_BxKxSxH)
                   + jnp.einsum("bkgts,bksh->bkgth", probs[..., s:], new_values_BxKxTxH))
  return ungroup(out_BxKxGxTxH)


def _native_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                      old_visible_BxTxS, new_visible_BxTxT):
  b, t, n, h = q_BxTxNxH.shape
  out = jax.ShapeDtypeStruct((b, t, n, h), _F32)
  out_BxTxNxH = jax.ffi.ffi_call(TARGETS["AsdBlockAttention"], out, vmap_method="sequential")(
      q_BxTxNxH, k_cache_BxKxHxS, v_cache_BxKxSxH, k_BxTxKxH, v_BxTxKxH, old_visible_BxTxS,
      new_visible_BxTxT)
  return out_BxTxNxH.reshape(b, t, n * h)


@jax.custom_vjp
def _cpu_or_reference(*args):
  return jax.lax.platform_dependent(*args, cpu=_native_attention, default=reference_attention)


def _fwd(*args):
  return _cpu_or_reference(*args), args


def _bwd(args, g):
  return jax.vjp(reference_attention, *args)[1](g)


_cpu_or_reference.defvjp(_fwd, _bwd)


def block_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH,
                    old_visible_BxTxS, new_visible_BxTxT):
  """`reference_attention`'s result; the native kernel for float32 when lowered for the CPU."""
  args = (q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache_BxKxHxS, v_cache_BxKxSxH, old_visible_BxTxS,
          new_visible_BxTxT)
  if all(a.dtype == _F32 for a in args[:5]) and native_available():
    return _cpu_or_reference(*args)
  return reference_attention(*args)
