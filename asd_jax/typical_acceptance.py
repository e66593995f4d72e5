"""Medusa typical acceptance: a lossy, entropy-adaptive comparison rule.

Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with Multiple Decoding
Heads", Sec. 2.3.1: accept x_i when

  p_i(x_i) > min(epsilon, delta * exp(-H(p_i))),   p_i = softmax(Z[i] / T),

and commit the longest accepted prefix. Flat target rows (high entropy) lower the threshold,
so near-ties are accepted; this is the local-only relaxation the ASD paper compares against
(it has no ledger). The defaults epsilon = 0.09, delta = 0.3 are Medusa's. With delta < 1 the
target argmax is always accepted, so the rule accepts at least what strict greedy accepts.
The next token is the target argmax of row a (Medusa samples it; greedy here, so the rule
compares directly with strict and ASD verification).

Shapes: B batch rows, K draft block length, R = K+1 logits rows, V vocabulary.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax.scipy.special import entr

from asd_jax import verify_checks as checks
from asd_jax.greedy_verify import prefix_length, target_argmax
from asd_jax.spec_sampling import check_float32_temperature, scale_logits
from asd_jax.verify_output import NONFINITE_TOKEN, VerifyOutput


@functools.partial(jax.jit, static_argnames=("temperature",))
def _typical_core(draft_BxK, logits_BxRxV, spent_B, threshold, alpha, temperature):
  k = draft_BxK.shape[1]
  vocab = logits_BxRxV.shape[-1]
  best_BxR, _, nonfinite_B = target_argmax(logits_BxRxV)
  p_BxKxV = jax.nn.softmax(scale_logits(logits_BxRxV[:, :k], temperature), axis=-1)
  entropy_BxK = jnp.sum(entr(p_BxKxV), axis=-1)
  in_vocab_BxK = (draft_BxK >= 0) & (draft_BxK < vocab)
  safe_BxKx1 = jnp.where(in_vocab_BxK, draft_BxK, 0)[..., None]
  px_BxK = jnp.take_along_axis(p_BxKxV, safe_BxKx1, axis=-1)[..., 0]
  accept_BxK = in_vocab_BxK & (px_BxK > jnp.minimum(threshold, alpha * jnp.exp(-entropy_BxK)))
  accepted_B = prefix_length(accept_BxK)
  next_B = jnp.take_along_axis(best_BxR, accepted_B[:, None], axis=1)[:, 0]
  off_argmax_B = jnp.sum((draft_BxK != best_BxR[:, :k]) & (jnp.arange(k) < accepted_B[:, None]),
                         axis=-1, dtype=jnp.int32)
  return VerifyOutput(
      num_accepted=jnp.where(nonfinite_B, 0, accepted_B),
      next_token=jnp.where(nonfinite_B, NONFINITE_TOKEN, next_B),
      spent=spent_B,
      num_exceptions=jnp.where(nonfinite_B, 0, off_argmax_B),
      nonfinite=nonfinite_B,
  )


def typical_verify(draft_tokens, target_logits, spent=None, *, posterior_threshold=0.09,
                   posterior_alpha=0.3, temperature: float = 1.0,
                   check_values: bool = True) -> VerifyOutput:
  """Medusa typical acceptance of a block of K draft tokens per row (lossy).

  Args:
    draft_tokens: int[B, K]; target_logits: float[B, K+1, V].
    spent: optional float[B] ledger, passed through unchanged (zeros if None).
    posterior_threshold: epsilon, the hard cap of the threshold (>= 0).
    posterior_alpha: delta, the entropy-scaled part of the threshold (>= 0).
    temperature: static T > 0 of the target distribution the test reads.
    check_values: check ids on concrete inputs (skipped under jit).

  Returns:
    VerifyOutput; num_exceptions counts accepted tokens that differ from the target argmax.
  """
  for name, value in (("posterior_threshold", posterior_threshold),
                      ("posterior_alpha", posterior_alpha)):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
        math.isfinite(value) and value >= 0):
      raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
      math.isfinite(temperature) and temperature > 0):
    raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
  check_float32_temperature(temperature)
  draft, z, vocab = checks.block(draft_tokens, target_logits)
  checks.token_range(draft, vocab, "draft_tokens", check_values)
  b = draft.shape[0]
  spent_B = jnp.zeros((b,), jnp.float32) if spent is None else checks.ledger(
      spent, b, check_values)
  return _typical_core(draft, z, spent_B, jnp.float32(posterior_threshold),
                       jnp.float32(posterior_alpha), temperature=float(temperature))
