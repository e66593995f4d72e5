"""ASD — approximate speculative decoding: greedy verification with a request-level regret ledger.

The rule of specs/asd.md, for one block per row (i is 0-based):

  y*_i = argmax Z[i]            m_i = x_i != y*_i          r_i = max(0, max Z[i] - Z[i, x_i])
  q_i  = K - i  (or (K - i)/K)  C_i = sum_{j<=i} m_j r_j   N_i = sum_{j<=i} m_j
  ok_i = (not m_i or r_i / q_i <= g)
         and (not m_i or (C_i - r_i < budget - s and C_i <= budget - s))
         and N_i <= M
  a = longest all-true prefix of ok;  commit x_{<a}, then y*_a;  s <- s + C_{a-1}

Shapes: B batch rows, K draft block length, V vocabulary, P proposals (rows, or tree paths).
  draft_BxK    int32 draft tokens
  logits_BxRxV target logits, R = K+1 (row K is the bonus row), any float dtype
  spent_B      float32 regret already spent by each request (the ledger)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax import verify_checks as checks
from asd_jax.asd_config import ASDConfig
from asd_jax.greedy_verify import prefix_length, target_argmax
from asd_jax.verify_output import NONFINITE_TOKEN, VerifyOutput


def accept_prefix(mismatch_PxK, regret_PxK, length_P, remaining_P, gate, max_exceptions,
                  normalize_q: bool):
  """The ASD acceptance for P proposals of up to K positions; positions >= length are padding.

  Regrets are float32. The budget test is strict (`<`) on what remained *before* the
  mismatch, so a zero-regret tie is rejected when nothing remains. C and N only grow, so the
  accepted prefix is one cumprod over the ok-mask.

  Returns (accepted int32[P], charge float32[P] regret of the accepted mismatches,
  exceptions int32[P] number of accepted mismatches).
  """
  k = mismatch_PxK.shape[-1]
  pos_K = jnp.arange(k, dtype=jnp.int32)
  valid_PxK = pos_K < length_P[:, None]
  q_PxK = (length_P[:, None] - pos_K).astype(jnp.float32)
  if normalize_q:
    q_PxK = q_PxK / length_P[:, None].astype(jnp.float32)
  q_PxK = jnp.where(valid_PxK, q_PxK, 1.0)

  charge_PxK = jnp.where(mismatch_PxK, regret_PxK, 0.0)
  charged_PxK = jnp.cumsum(charge_PxK, axis=-1)
  count_PxK = jnp.cumsum(mismatch_PxK.astype(jnp.int32), axis=-1)
  rem_Px1 = remaining_P[:, None]

  gate_ok = regret_PxK / q_PxK <= gate
  budget_ok = (charged_PxK - charge_PxK < rem_Px1) & (charged_PxK <= rem_Px1)
  ok_PxK = (~mismatch_PxK | (gate_ok & budget_ok)) & (count_PxK <= max_exceptions) & valid_PxK

  accepted_P = prefix_length(ok_PxK)
  inside_PxK = pos_K < accepted_P[:, None]
  charge_P = jnp.sum(jnp.where(inside_PxK, charge_PxK, 0.0), axis=-1)
  exceptions_P = jnp.sum(inside_PxK & mismatch_PxK, axis=-1, dtype=jnp.int32)
  return accepted_P, charge_P, exceptions_P


def draft_regret(tokens_K, rows_K, best_R, top_R, logits_RxV):
  """Mismatch flags and float32 regrets of K drafted tokens, token k scored by row rows_K[k].

  One request (vmap for a batch). A chain scores position i with row i; a tree scores node n
  with the row of its parent. An id outside [0, V) (possible only under jit, where ids are
  not checked) is a mismatch with infinite regret, so no setting can accept it.
  """
  vocab = logits_RxV.shape[-1]
  in_vocab_K = (tokens_K >= 0) & (tokens_K < vocab)
  drafted_K = logits_RxV[rows_K, jnp.where(in_vocab_K, tokens_K, 0)].astype(jnp.float32)
  regret_K = jnp.maximum(top_R[rows_K] - drafted_K, 0.0)
  return tokens_K != best_R[rows_K], jnp.where(in_vocab_K, regret_K, jnp.inf)


def settle_ledger(spent_B, charge_B, budget):
  # s + (B - s) can round one ulp above B in float32; the ledger must never pass the budget.
  # A ledger already above budget (caller's choice) is left where it is.
  return jnp.minimum(spent_B + charge_B, jnp.maximum(budget, spent_B))


@functools.partial(jax.jit, static_argnames=("normalize_q",))
def _asd_core(draft_BxK, logits_BxRxV, spent_B, budget, gate, max_exceptions, *, normalize_q,
              lengths_B=None):
  b, k = draft_BxK.shape
  lengths_B = checks.draft_lengths(lengths_B, b, k, check_values=False)
  best_BxR, top_BxR, nonfinite_B = target_argmax(logits_BxRxV)
  rows_K = jnp.arange(k, dtype=jnp.int32)
  mismatch_BxK, regret_BxK = jax.vmap(draft_regret, in_axes=(0, None, 0, 0, 0))(
      draft_BxK, rows_K, best_BxR, top_BxR, logits_BxRxV)
  accepted_B, charge_B, exceptions_B = accept_prefix(
      mismatch_BxK, regret_BxK, lengths_B, budget - spent_B, gate, max_exceptions, normalize_q)
  # The recovery/bonus token is the target's own choice: read, never charged.
  next_B = jnp.take_along_axis(best_BxR, accepted_B[:, None], axis=1)[:, 0]
  return VerifyOutput(
      num_accepted=jnp.where(nonfinite_B, 0, accepted_B),
      next_token=jnp.where(nonfinite_B, NONFINITE_TOKEN, next_B),
      spent=jnp.where(nonfinite_B, spent_B, settle_ledger(spent_B, charge_B, budget)),
      num_exceptions=jnp.where(nonfinite_B, 0, exceptions_B),
      nonfinite=nonfinite_B,
  )


def asd_verify_traced(draft_BxK, logits_BxRxV, spent_B, budget, gate, max_exceptions, *,
                      normalize_q: bool = False, draft_lengths_B=None) -> VerifyOutput:
  """`asd_verify` for use inside a jitted loop with budget/gate/max_exceptions as traced
  scalars (float32, float32, int32), so one compiled program serves every setting.

  draft_lengths_B (int32[B] in [0, K], None: all K): row b's block is its first
  draft_lengths_B[b] tokens, the rest padding that is never accepted, and the gate counts
  the tokens left from that length: the verdict a block of that width alone would get.
  No validation happens here: validate an `ASDConfig` at the Python boundary first.
  """
  return _asd_core(draft_BxK, logits_BxRxV, spent_B, budget, gate, max_exceptions,
                   normalize_q=normalize_q, lengths_B=draft_lengths_B)


def config_scalars(config: ASDConfig):
  """The traced settings (budget, gate, max_exceptions) as fixed-dtype scalars."""
  return (np.float32(config.budget), np.float32(config.gate), np.int32(config.max_exceptions))


def asd_verify(draft_tokens, target_logits, spent, config: ASDConfig, *,
               check_values: bool = True) -> VerifyOutput:
  """ASD block verification (specs/asd.md), batched over rows.

  Args:
    draft_tokens: int[B, K], K >= 1.
    target_logits: float[B, K+1, V]; bf16 is fine, regrets are computed in float32.
    spent: float[B] regret already spent by each request.
    config: `ASDConfig`; budget, gate and max_exceptions are traced, so changing them never
      recompiles. Only `normalize_q` is static.
    check_values: check ids and the ledger on concrete inputs (skipped automatically under
      jit, where an id outside the vocabulary is simply never accepted).

  Returns:
    VerifyOutput with num_accepted in 0..K, next_token = argmax of row num_accepted, spent
    non-decreasing and never spent past the budget (a ledger that comes in above it, e.g.
    after the budget was lowered mid-request, is returned unchanged and accepts no
    mismatch), num_exceptions <= max_exceptions. With budget
    0 or max_exceptions 0 it equals `greedy_verify`. Rows with non-finite logits are flagged
    in `nonfinite` (see `VerifyOutput`).
  """
  checks.config(config, ASDConfig)
  draft, z, vocab = checks.block(draft_tokens, target_logits)
  checks.token_range(draft, vocab, "draft_tokens", check_values)
  spent_B = checks.ledger(spent, draft.shape[0], check_values)
  return _asd_core(draft, z, spent_B, *config_scalars(config), normalize_q=config.normalize_q)
