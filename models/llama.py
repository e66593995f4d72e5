"""Llama-family decoder in Flax NNX (Llama 2/3.x, Qwen2/2.5, Qwen3, SmolLM2, Mistral-style GQA).

Shape notation: see models/kv_cache.py (B, T, S, L, K kv heads, G = query heads per kv head,
H head dim, D width, F MLP width, V vocab, N = number of hidden layers requested).

Precision: parameters and activations in `cfg.dtype` (float32 or bfloat16); RMSNorm statistics,
attention softmax and logits are always float32.
"""

from __future__ import annotations

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np

from models.block_quant import Q4_1Records, Q8_0Rows
from models.config import ModelConfig, rope_inverse_frequencies
from models.cached_attention import BlockMask, block_mask, cached_attention
from models.few_rows_matmul import few_rows_dot_general, few_rows_matmul
from models.kv_cache import KVCache

_F32 = jnp.float32


def rms_norm(x, scale_D, eps: float):
  """RMSNorm with float32 statistics, in x's dtype. HF casts back to the activation dtype
  before the weight multiply; this matches it for bf16 parity."""
  x32 = x.astype(_F32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return scale_D.astype(x.dtype) * y.astype(x.dtype)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, param_dtype):
    self.scale = nnx.Param(jnp.ones((dim,), param_dtype))
    self.eps = eps

  def __call__(self, x):
    return rms_norm(x, self.scale[...], self.eps)


class WeightBlocks(nnx.Variable):
  """A weight's GGUF blocks in a native kernel's layout (models/block_quant.py).

  Not a Param: never trained, checkpointed or counted; the float32 Param beside it holds the
  same numbers and serves every other computation.
  """


class Linear(nnx.Linear):
  """nnx.Linear whose few-row float32 products run on the native kernel; from the checkpoint's
  Q4_1 blocks (`q4_1`, set by `models.hf_params.attach_weight_blocks`) when it has them."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, dot_general=few_rows_dot_general, **kwargs)
    self.q4_1: WeightBlocks | None = nnx.data(None)   # data: may become a WeightBlocks

  def __call__(self, x):
    if self.q4_1 is None:
      return super().__call__(x)
    y = few_rows_matmul(x, self.kernel[...], blocks=Q4_1Records(self.q4_1[...]))
    return y if self.bias is None else y + self.bias[...]


def linear(d_in: int, d_out: int, dtype, rngs: nnx.Rngs, bias: bool = False) -> Linear:
  """The decoders' and drafters' projection; few-row float32 matmuls go to the native kernel."""
  return Linear(d_in, d_out, use_bias=bias, dtype=dtype, param_dtype=dtype,
                kernel_init=nnx.initializers.normal(0.02), rngs=rngs)


def _linear(cfg: ModelConfig, d_in: int, d_out: int, bias: bool, rngs: nnx.Rngs) -> Linear:
  return linear(d_in, d_out, jnp.dtype(cfg.dtype), rngs, bias)


def apply_rope(x_BxTxNxH: jax.Array, positions_BxT: jax.Array, inv_freq: jax.Array) -> jax.Array:
  """Rotate-half RoPE (the Hugging Face layout; GGUF weights are un-permuted on load)."""
  angles_BxTxH2 = positions_BxT.astype(_F32)[..., None] * inv_freq
  angles_BxTx1xH = jnp.concatenate([angles_BxTxH2, angles_BxTxH2], axis=-1)[:, :, None, :]
  cos, sin = jnp.cos(angles_BxTx1xH), jnp.sin(angles_BxTx1xH)
  x32 = x_BxTxNxH.astype(_F32)
  half = x32.shape[-1] // 2
  rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
  return (x32 * cos + rotated * sin).astype(x_BxTxNxH.dtype)


class Attention(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    d, h = cfg.hidden_size, cfg.head_dim
    self.q_proj = _linear(cfg, d, cfg.num_heads * h, cfg.qkv_bias, rngs)
    self.k_proj = _linear(cfg, d, cfg.num_kv_heads * h, cfg.qkv_bias, rngs)
    self.v_proj = _linear(cfg, d, cfg.num_kv_heads * h, cfg.qkv_bias, rngs)
    self.o_proj = _linear(cfg, cfg.num_heads * h, d, cfg.o_bias, rngs)
    if cfg.qk_norm:
      self.q_norm = RMSNorm(h, cfg.rms_norm_eps, jnp.dtype(cfg.dtype))
      self.k_norm = RMSNorm(h, cfg.rms_norm_eps, jnp.dtype(cfg.dtype))

  def __call__(self, x_BxTxD, positions_BxT, mask: BlockMask, k_cache, v_cache, slots_BxT,
               inv_freq):
    cfg = self.cfg
    b, t, _ = x_BxTxD.shape
    kvh, h = cfg.num_kv_heads, cfg.head_dim
    q_BxTxNxH = self.q_proj(x_BxTxD).reshape(b, t, cfg.num_heads, h)
    k_BxTxKxH = self.k_proj(x_BxTxD).reshape(b, t, kvh, h)
    v_BxTxKxH = self.v_proj(x_BxTxD).reshape(b, t, kvh, h)
    if cfg.qk_norm:
      q_BxTxNxH, k_BxTxKxH = self.q_norm(q_BxTxNxH), self.k_norm(k_BxTxKxH)
    q_BxTxNxH = apply_rope(q_BxTxNxH, positions_BxT, inv_freq)
    k_BxTxKxH = apply_rope(k_BxTxKxH, positions_BxT, inv_freq)
    out_BxTxD, k_cache, v_cache = cached_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, k_cache,
                                                   v_cache, slots_BxT, mask)
    return self.o_proj(out_BxTxD), k_cache, v_cache


class MLP(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.gate_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
    self.up_proj = _linear(cfg, cfg.hidden_size, cfg.intermediate_size, False, rngs)
    self.down_proj = _linear(cfg, cfg.intermediate_size, cfg.hidden_size, False, rngs)

  def __call__(self, x):
    return self.down_proj(jax.nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nnx.Module):

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    dtype = jnp.dtype(cfg.dtype)
    self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.attn = Attention(cfg, rngs)
    self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    self.mlp = MLP(cfg, rngs)

  def __call__(self, x_BxTxD, positions_BxT, mask: BlockMask, k_cache, v_cache, slots_BxT,
               inv_freq):
    attn_out, k_cache, v_cache = self.attn(self.input_norm(x_BxTxD), positions_BxT, mask,
                                           k_cache, v_cache, slots_BxT, inv_freq)
    x_BxTxD = x_BxTxD + attn_out
    x_BxTxD = x_BxTxD + self.mlp(self.post_attn_norm(x_BxTxD))
    return x_BxTxD, k_cache, v_cache


def chain_visibility(slots_BxT: jax.Array, positions_BxT: jax.Array, capacity: int) -> jax.Array:
  """bool[B, T, S]: a query sees every slot up to its own position (chain layout, slot == pos)."""
  del slots_BxT
  return jnp.arange(capacity)[None, None, :] <= positions_BxT[:, :, None]


class Decoder(nnx.Module):
  """The target decoder. Use `forward` (pure inputs/outputs) rather than module state."""

  def __init__(self, cfg: ModelConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    dtype = jnp.dtype(cfg.dtype)
    self.embed = nnx.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dtype, param_dtype=dtype,
                           embedding_init=nnx.initializers.normal(0.02), rngs=rngs)
    self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.num_layers)])
    self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
    if not cfg.tie_embeddings:
      self.lm_head = _linear(cfg, cfg.hidden_size, cfg.vocab_size, False, rngs)
    self.inv_freq = nnx.Variable(jnp.asarray(rope_inverse_frequencies(cfg), _F32))
    # The tied embedding's Q8_0 blocks for the LM head, when the checkpoint has them.
    self.head_q8_0_q: WeightBlocks | None = nnx.data(None)   # int8 [V, D]
    self.head_q8_0_d: WeightBlocks | None = nnx.data(None)   # float32 [V, D / 32]

  def head_VxD(self) -> jax.Array:
    """The LM head as [V, D]: the tied embedding, or lm_head's kernel transposed (inside jit
    the transpose folds into the einsum that uses it). Drafters that share the head read it
    here."""
    if self.cfg.tie_embeddings:
      return self.embed.embedding[...]
    return self.lm_head.kernel[...].T

  def logits(self, h_BxTxD: jax.Array) -> jax.Array:
    """Final norm + LM head; float32 logits [B, T, V]."""
    h = self.final_norm(h_BxTxD)
    if self.cfg.tie_embeddings:
      w_VxD = self.embed.embedding[...]
      blocks = None
      if self.head_q8_0_q is not None:
        blocks = Q8_0Rows(q=self.head_q8_0_q[...], d=self.head_q8_0_d[...])
      return few_rows_matmul(h, w_VxD, transposed=True, preferred_element_type=_F32,
                             blocks=blocks)
    return few_rows_matmul(h, self.lm_head.kernel[...], preferred_element_type=_F32)

  def __call__(self, tokens_BxT, positions_BxT, cache: KVCache, *, slots_BxT=None,
               visible_BxTxS=None, hidden_layers: tuple[int, ...] = (), logits_at_BxR=None):
    """Runs T new tokens per row through the decoder, writing their K/V into the cache.

    Args:
      tokens_BxT: int32 token ids.
      positions_BxT: int32 RoPE positions.
      cache: the KV cache; entries are written at `slots_BxT` (default: the positions).
      slots_BxT: cache slots for the new tokens (trees use slots != positions).
      visible_BxTxS: attention mask over cache slots (default: chain causal by position).
      hidden_layers: 0-based layer indices whose *output* (pre-final-norm residual stream)
        is returned; -1 selects the embeddings.
      logits_at_BxR: if given, logits only at these token indices (e.g. the last prompt token).

    Returns:
      (logits float32 [B, T or R, V], hidden [B, T, N, D] or None, updated cache).
    """
    if slots_BxT is None:
      slots_BxT = positions_BxT
    if visible_BxTxS is None:
      visible_BxTxS = chain_visibility(slots_BxT, positions_BxT, cache.capacity)
    mask = block_mask(slots_BxT, visible_BxTxS, cache.capacity)
    inv_freq = self.inv_freq[...]
    x_BxTxD = self.embed(tokens_BxT)
    collected = {-1: x_BxTxD} if -1 in hidden_layers else {}
    new_k, new_v = [], []
    for i, layer in enumerate(self.layers):
      x_BxTxD, k, v = layer(x_BxTxD, positions_BxT, mask, cache.k[i], cache.v[i], slots_BxT,
                            inv_freq)
      new_k.append(k)
      new_v.append(v)
      if i in hidden_layers:
        collected[i] = x_BxTxD
    hidden = (jnp.stack([collected[i] for i in hidden_layers], axis=2) if hidden_layers else None)
    if logits_at_BxR is not None:
      x_BxTxD = jnp.take_along_axis(x_BxTxD, logits_at_BxR[:, :, None], axis=1)
    return self.logits(x_BxTxD), hidden, KVCache(k=tuple(new_k), v=tuple(new_v))


def init_decoder(cfg: ModelConfig, seed: int = 0) -> Decoder:
  """A randomly initialised decoder (tests, drafters trained from scratch)."""
  return Decoder(cfg, nnx.Rngs(seed))


def num_parameters(model: Decoder) -> int:
  state = nnx.state(model, nnx.Param)
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(state)))
