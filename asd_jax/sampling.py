"""Token selection for plain decoding: greedy, temperature, top-k and top-p (nucleus).

Shape notation: B rows, V vocab.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Static sampling settings. temperature == 0 means greedy (argmax, first max on ties)."""

  temperature: float = 0.0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1.0 = off

  def __post_init__(self):
    if not math.isfinite(self.temperature) or self.temperature < 0:
      raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
    if int(self.top_k) != self.top_k or self.top_k < 0:
      raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k}")
    if not (0.0 < self.top_p <= 1.0):
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0


def filtered_logits(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """Temperature-scaled float32 logits with top-k / top-p exclusions set to -inf.

  The same filter is applied to target and draft distributions in speculative sampling, so a
  lossless rule compares like with like. Ties at the top-k boundary are all kept.
  """
  x = logits_BxV.astype(jnp.float32) / max(cfg.temperature, 1e-6)
  if cfg.top_k and cfg.top_k < x.shape[-1]:
    kth_B1 = jax.lax.top_k(x, cfg.top_k)[0][:, -1:]
    x = jnp.where(x < kth_B1, -jnp.inf, x)
  if cfg.top_p < 1.0:
    sorted_BxV = jnp.sort(x, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_BxV, axis=-1)
    # Keep the smallest prefix whose mass reaches top_p: a token is kept if the mass strictly
    # before it is < top_p. The threshold is the smallest kept logit.
    before = jnp.cumsum(probs, axis=-1) - probs
    kept = before < cfg.top_p
    threshold_B1 = jnp.min(jnp.where(kept, sorted_BxV, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x < threshold_B1, -jnp.inf, x)
  return x


def probabilities(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """The distribution a sampler with `cfg` draws from (one-hot argmax when greedy)."""
  if cfg.greedy:
    return jax.nn.one_hot(jnp.argmax(logits_BxV, axis=-1), logits_BxV.shape[-1], dtype=jnp.float32)
  return jax.nn.softmax(filtered_logits(logits_BxV, cfg), axis=-1)


def select_token(logits_BxV: jax.Array, rng: jax.Array, cfg: SamplingConfig) -> jax.Array:
  """int32[B]: argmax when greedy, else a sample from the filtered distribution."""
  if cfg.greedy:
    return jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32)
  return jax.random.categorical(rng, filtered_logits(logits_BxV, cfg), axis=-1).astype(jnp.int32)
