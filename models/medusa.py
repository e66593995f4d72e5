"""Medusa heads: H residual blocks on the target's last hidden state, one per future offset.

Shape notation: see models/kv_cache.py, plus M = number of Medusa heads.

Conventions (FasterDecoding/Medusa `medusa/model/medusa_model.py`):
- Input: the target's last hidden state *after* its final norm (`base_model.model(...)[0]`
  of a HF Llama). With this repo's Decoder that is
  `target.final_norm(hidden_BxTxNxD[:, :, -1])` for `hidden_layers=(L - 1,)`.
- Head m (0-based) at position t predicts the token at t + 2 + m: the target's own head
  predicts t + 1, so the heads continue from there (Medusa trains head m on labels[2 + m:]).
- Each head is ResBlock(x) = x + SiLU(x W + b) (W: D x D with bias), then an LM head. By
  default the heads share the target's LM head (Medusa-1 initialises its per-head heads
  from it); `own_head=True` gives each head its own [D, V] matrix.
- Zero W and b make a ResBlock the identity (Medusa's initialisation), so a fresh head
  reproduces the target's next-token logits.
"""

from __future__ import annotations

import dataclasses

import flax.nnx as nnx
import jax
import jax.numpy as jnp

from models.config import DTYPES

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class MedusaConfig:
  """Static description of a set of Medusa heads (hashable)."""

  hidden_size: int  # D, the target's width
  vocab_size: int  # V, the target's vocabulary
  num_heads: int = 4  # M
  own_head: bool = False  # False: every head uses the target's LM head
  dtype: str = "float32"

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
    for name in ("hidden_size", "vocab_size", "num_heads"):
      if getattr(self, name) <= 0:
        raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

  def with_dtype(self, dtype: str) -> "MedusaConfig":
    return dataclasses.replace(self, dtype=dtype)


class StackedLinear(nnx.Module):
  """M independent linear maps stored as one [M, D_in, D_out] kernel (one einsum for all)."""

  def __init__(self, num: int, d_in: int, d_out: int, bias: bool, dtype, init_scale: float,
               rngs: nnx.Rngs):
    shape = (num, d_in, d_out)
    self.kernel = nnx.Param(init_scale * jax.random.normal(rngs.params(), shape, dtype)
                            if init_scale else jnp.zeros(shape, dtype))
    if bias:
      self.bias = nnx.Param(jnp.zeros((num, d_out), dtype))


class MedusaHeads(nnx.Module):
  """Parameters of the Medusa heads; compute with `medusa_logits` (a pure function)."""

  def __init__(self, cfg: MedusaConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    dtype = jnp.dtype(cfg.dtype)
    d, m = cfg.hidden_size, cfg.num_heads
    self.res = StackedLinear(m, d, d, True, dtype, 0.0, rngs)  # identity blocks, as Medusa
    if cfg.own_head:
      self.own_head = StackedLinear(m, d, cfg.vocab_size, False, dtype, 0.02, rngs)


def init_medusa(cfg: MedusaConfig, seed: int = 0, target=None) -> MedusaHeads:
  """Fresh heads (identity ResBlocks). With own_head and a `target` Decoder, every own head
  starts as a copy of the target's LM head, as Medusa initialises them."""
  model = MedusaHeads(cfg, nnx.Rngs(seed))
  if cfg.own_head and target is not None:
    head_VxD = getattr(target, "model", target).head_VxD()
    if tuple(head_VxD.shape) != (cfg.vocab_size, cfg.hidden_size):
      raise ValueError(f"target head {tuple(head_VxD.shape)} does not fit ({cfg.vocab_size}, "
                       f"{cfg.hidden_size})")
    model.own_head.kernel.set_value(jnp.broadcast_to(
        jnp.asarray(head_VxD.T, jnp.dtype(cfg.dtype)), model.own_head.kernel.shape))
  return model


def medusa_hidden(params, last_hidden_BxTxD: jax.Array) -> jax.Array:
  """The M ResBlock outputs [B, T, M, D] (no LM head)."""
  kernel_MxDxD = params["res"]["kernel"][...]
  x_BxTxD = last_hidden_BxTxD.astype(kernel_MxDxD.dtype)
  pre_BxTxMxD = jnp.einsum("btd,mde->btme", x_BxTxD, kernel_MxDxD) + params["res"]["bias"][...]
  return x_BxTxD[:, :, None, :] + jax.nn.silu(pre_BxTxMxD)


def medusa_logits(params, last_hidden_BxTxD: jax.Array,
                  target_head_VxD: jax.Array | None) -> jax.Array:
  """Logits float32 [B, T, M, V]; row m at position t scores the token at t + 2 + m.

  Args:
    params: `nnx.state(heads)` of a `MedusaHeads` (a pytree; pass it through jit).
    last_hidden_BxTxD: the target's last hidden state after its final norm.
    target_head_VxD: the target's LM head ([V, D], `Decoder.head_VxD()`) for heads that
      share it; None for heads with their own (`own_head=True`).
  """
  h_BxTxMxD = medusa_hidden(params, last_hidden_BxTxD)
  own = "own_head" in params
  if own == (target_head_VxD is not None):
    raise ValueError("pass target_head_VxD exactly when the heads share the target's LM head "
                     f"(these heads have own_head={own})")
  if own:
    return jnp.einsum("btmd,mdv->btmv", h_BxTxMxD, params["own_head"]["kernel"][...],
                      preferred_element_type=_F32)
  return jnp.einsum("btmd,vd->btmv", h_BxTxMxD, target_head_VxD.astype(h_BxTxMxD.dtype),
                    preferred_element_type=_F32)
