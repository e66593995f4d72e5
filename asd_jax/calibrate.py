"""The q25 calibration recipe of specs/asd.md: budget = gate = 25th percentile of r/q at the
first strict rejection, over calibration rounds (the paper uses ~32 prompts).

Shapes: B batch rows, K draft block length, R = K+1 logits rows, V vocabulary. Rounds may
differ in B and K (each shape compiles once).
"""

from __future__ import annotations

import functools
import numbers
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax import verify_checks as checks
from asd_jax.asd_config import ASDConfig
from asd_jax.asd_verify import draft_regret
from asd_jax.greedy_verify import target_argmax


@functools.partial(jax.jit, static_argnames=("normalize_q",))
def _first_rejection(draft_BxK, logits_BxRxV, normalize_q):
  k = draft_BxK.shape[1]
  best_BxR, top_BxR, nonfinite_B = target_argmax(logits_BxRxV)
  rows_K = jnp.arange(k, dtype=jnp.int32)
  mismatch_BxK, regret_BxK = jax.vmap(draft_regret, in_axes=(0, None, 0, 0, 0))(
      draft_BxK, rows_K, best_BxR, top_BxR, logits_BxRxV)
  first_B = jnp.argmax(mismatch_BxK, axis=-1)
  q_B = (k - first_B).astype(jnp.float32)
  if normalize_q:
    q_B = q_B / k
  ratio_B = jnp.take_along_axis(regret_BxK, first_B[:, None], axis=-1)[:, 0] / q_B
  return jnp.any(mismatch_BxK, axis=-1) & ~nonfinite_B, ratio_B, nonfinite_B


def first_rejection_ratios(draft_tokens_rounds, target_logits_rounds, *,
                           normalize_q: bool = True, check_values: bool = True) -> np.ndarray:
  """r_i / q_i at the first strict rejection of every row and round that has one.

  Args:
    draft_tokens_rounds: sequence of int[B, K] blocks, one per calibration round.
    target_logits_rounds: matching sequence of float[B, K+1, V].
    normalize_q: q_i = (K - i)/K (the recipe's choice) instead of K - i.

  Returns:
    float64[n] ratios; rows without a rejection, or with non-finite logits, contribute none.
    A rejected id with -inf logit has an infinite ratio.
  """
  return _ratios_and_skips(draft_tokens_rounds, target_logits_rounds, normalize_q,
                           check_values)[0]


def _ratios_and_skips(draft_tokens_rounds, target_logits_rounds, normalize_q, check_values):
  """(ratios, rows skipped for non-finite logits, rounds holding such rows, rows in all)."""
  drafts, logits = list(draft_tokens_rounds), list(target_logits_rounds)
  if len(drafts) != len(logits):
    raise ValueError(f"got {len(drafts)} draft rounds but {len(logits)} logits rounds")
  found, skipped, skipped_rounds, rows = [], 0, 0, 0
  for i, (d, z) in enumerate(zip(drafts, logits)):
    draft, z, vocab = checks.block(d, z, f"draft_tokens_rounds[{i}]",
                                   f"target_logits_rounds[{i}]")
    checks.token_range(draft, vocab, f"draft_tokens_rounds[{i}]", check_values)
    rejected_B, ratio_B, nonfinite_B = _first_rejection(draft, z, normalize_q=normalize_q)
    found.append(np.asarray(ratio_B, np.float64)[np.asarray(rejected_B)])
    bad = int(np.sum(np.asarray(nonfinite_B)))
    skipped, skipped_rounds, rows = skipped + bad, skipped_rounds + (bad > 0), rows + len(draft)
  ratios = np.concatenate(found) if found else np.zeros((0,), np.float64)
  return ratios, skipped, skipped_rounds, rows


def calibrate_asd(draft_tokens_rounds, target_logits_rounds, *, quantile: float = 0.25,
                  max_exceptions: int = 1, normalize_q: bool = True,
                  check_values: bool = True) -> ASDConfig:
  """ASDConfig from calibration rounds by the q25 recipe (specs/asd.md).

  budget = gate = the `quantile` (linear interpolation, numpy's default) of r/q at the first
  strict rejection over all rows and rounds; max_exceptions = 1; q normalised. Rows with
  non-finite logits (NaN, +inf, or -inf throughout) are skipped. Infinite ratios (a rejected id
  with -inf logit) count as the largest float32; if they fill the quantile, budget = gate =
  float32 max, which admits every finite first rejection, and a RuntimeWarning says so.
  Calibrate on prompts disjoint from the evaluation.

  Raises:
    ValueError: no row has a strict rejection with finite logits (nothing to calibrate on; the
      message counts the rows skipped for non-finite logits), or bad inputs.
  """
  if isinstance(quantile, bool) or not isinstance(quantile, numbers.Real) or not (
      0 <= quantile <= 1):
    raise ValueError(f"quantile must be in [0, 1], got {quantile!r}")
  ratios, skipped, skipped_rounds, rows = _ratios_and_skips(
      draft_tokens_rounds, target_logits_rounds, normalize_q, check_values)
  if ratios.size == 0:
    why = (f"; {skipped} of {rows} rows (in {skipped_rounds} rounds) had non-finite target "
           "logits (NaN or inf) and were skipped" if skipped else "")
    raise ValueError(f"no strict rejection in the calibration rounds{why}; nothing to "
                     "calibrate on")
  top = np.finfo(np.float32).max
  ratios = np.minimum(ratios, top)
  q = float(np.quantile(ratios, quantile))
  if q >= top:  # a gate that admits anything finite is almost surely not what was meant
    warnings.warn(f"calibrate_asd: budget = gate = float32 max: {int(np.sum(ratios >= top))} of "
                  f"{ratios.size} first rejections picked an id with -inf target logit, so the "
                  f"{quantile} quantile is infinite; this preset admits every finite first "
                  "rejection", RuntimeWarning, stacklevel=2)
  return ASDConfig(budget=q, gate=q, max_exceptions=max_exceptions, normalize_q=normalize_q)
