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


def target_argmax(logits_BxRxV):
  """Target greedy choices and their logits, one per row; shared by every greedy-type rule.

  Returns (best_BxR int32 first maximum on ties, top_BxR float32 its logit, nonfinite_B).
  Reading the max through the argmax costs a gather of R values instead of a second pass over
  V; jnp.argmax points at a NaN or +inf when there is one and at -inf when the whole row is
  -inf, so a non-finite `top` flags exactly the rows without a usable maximum.
  """
  best_BxR = jnp.argmax(logits_BxRxV, axis=-1).astype(jnp.int32)
  top_BxR = jnp.take_along_axis(logits_BxRxV, best_BxR[..., None], axis=-1)[..., 0]
  top_BxR = top_BxR.astype(jnp.float32)
  nonfinite_B = ~jnp.all(jnp.isfinite(top_BxR), axis=-1)
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
