"""Strict greedy block verification: accept the draft while it equals the target argmax.

Shapes: B batch rows, K draft block length, V vocabulary.
  draft_BxK    int32 draft tokens x_0..x_{K-1}
  logits_BxRxV target logits, R = K+1; row j scores position j given the prefix + x_{<j},
               row K is the bonus row
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from asd_jax import verify_checks as checks
from asd_jax.verify_output import NONFINITE_TOKEN, VerifyOutput


_CHUNK = 256


def first_argmax(x_xV):
  """jnp.argmax over the last axis (first maximum on ties), int32, and the maximum, float32.

  XLA:CPU lowers argmax to a scalar (value, index) reduction that is 10-100x slower than a
  plain max; reducing chunks of 256 with max, then taking argmax over the chunk maxima and
  inside the one winning chunk, reads the logits once at full speed. Same result: the first
  chunk holding the maximum holds its first occurrence. Rows holding a NaN get an unspecified
  answer (XLA:CPU's vectorised max does not propagate NaN reliably); detect them apart, as
  `target_argmax` does.
  """
  vocab = x_xV.shape[-1]
  if vocab < 2 * _CHUNK:
    best = jnp.argmax(x_xV, axis=-1).astype(jnp.int32)
    top = jnp.take_along_axis(x_xV, best[..., None], axis=-1)[..., 0]
    return best, top.astype(jnp.float32)
  main = vocab - vocab % _CHUNK
  chunks_xCxH = x_xV[..., :main].reshape(x_xV.shape[:-1] + (main // _CHUNK, _CHUNK))
  chunk_max_xC = jnp.max(chunks_xCxH, axis=-1)
  win_x = jnp.argmax(chunk_max_xC, axis=-1).astype(jnp.int32)
  top_x = jnp.take_along_axis(chunk_max_xC, win_x[..., None], axis=-1)[..., 0]
  inside_xH = jnp.take_along_axis(chunks_xCxH, win_x[..., None, None], axis=-2)[..., 0, :]
  best_x = win_x * _CHUNK + jnp.argmax(inside_xH, axis=-1).astype(jnp.int32)
  if main < vocab:
    tail_xT = x_xV[..., main:]
    tail_best_x = jnp.argmax(tail_xT, axis=-1).astype(jnp.int32)
    tail_top_x = jnp.take_along_axis(tail_xT, tail_best_x[..., None], axis=-1)[..., 0]
    # The tail comes later: it wins only with a strictly larger value, or a NaN first seen.
    tail_wins = (tail_top_x > top_x) | (jnp.isnan(tail_top_x) & ~jnp.isnan(top_x))
    best_x = jnp.where(tail_wins, main + tail_best_x, best_x)
    top_x = jnp.where(tail_wins, tail_top_x, top_x)
  return best_x, top_x.astype(jnp.float32)


def _has_nan(x_xV):
  # Max does not propagate NaN on CPU, a sum does, in one fused pass (the cheapest check for
  # float32). For 16-bit logits XLA:CPU would materialise a float32 copy of all the logits to
  # feed that sum, so they are compared with themselves instead.
  if jnp.dtype(x_xV.dtype).itemsize < 4:
    return jnp.any(x_xV != x_xV, axis=-1)
  return jnp.isnan(jnp.sum(x_xV, axis=-1, dtype=jnp.float32))


def target_argmax(logits_BxRxV):
  """Target greedy choices and their logits, one per row; shared by every greedy-type rule.

  Returns (best_BxR int32 first maximum on ties, top_BxR float32 its logit, nonfinite_B).
  nonfinite_B flags rows without a usable maximum in some logits row: a NaN anywhere, a +inf
  (then top is +inf) or a row that is -inf throughout (then top is -inf). Isolated -inf
  entries are fine.
  """
  best_BxR, top_BxR = first_argmax(logits_BxRxV)
  nan_BxR = _has_nan(logits_BxRxV)
  nonfinite_B = ~jnp.all(jnp.isfinite(top_BxR) & ~nan_BxR, axis=-1)
  return best_BxR, top_BxR, nonfinite_B


def prefix_length(ok_BxK):
  """Length of the longest all-true prefix of each row."""
  return jnp.sum(jnp.cumprod(ok_BxK.astype(jnp.int32), axis=-1), axis=-1, dtype=jnp.int32)


@jax.jit
def _greedy_core(draft_BxK, logits_BxRxV, spent_B):
  k = draft_BxK.shape[1]
  best_BxR, _, nonfinite_B = target_argmax(logits_BxRxV)
  accepted_B = prefix_length(draft_BxK == best_BxR[:, :k])
  next_B = jnp.take_along_axis(best_BxR, accepted_B[:, None], axis=1)[:, 0]
  return VerifyOutput(
      num_accepted=jnp.where(nonfinite_B, 0, accepted_B),
      next_token=jnp.where(nonfinite_B, NONFINITE_TOKEN, next_B),
      spent=spent_B,
      num_exceptions=jnp.zeros_like(accepted_B),
      nonfinite=nonfinite_B,
  )


def greedy_verify(draft_tokens, target_logits, spent=None, *,
                  check_values: bool = True) -> VerifyOutput:
  """Strict greedy verification of a block of K draft tokens per row.

  Args:
    draft_tokens: int[B, K], K >= 1.
    target_logits: float[B, K+1, V] (any float dtype).
    spent: optional float[B] ledger, passed through unchanged (zeros if None), so the result
      equals `asd_verify` at budget 0 field by field.
    check_values: check token ids on concrete inputs (skipped automatically under jit).

  Returns:
    VerifyOutput: num_accepted = longest prefix with x_i == argmax row i (first maximum on
    ties), next_token = argmax of row num_accepted, num_exceptions = 0. Inside jit an id
    outside the vocabulary never equals the argmax, so it is never accepted.
  """
  draft, z, vocab = checks.block(draft_tokens, target_logits)
  checks.token_range(draft, vocab, "draft_tokens", check_values)
  b = draft.shape[0]
  spent_B = jnp.zeros((b,), jnp.float32) if spent is None else checks.ledger(
      spent, b, check_values)
  return _greedy_core(draft, z, spent_B)
