"""The q25 calibration recipe: budget = gate = 25th percentile of r/q at the first rejection."""

import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.asd_verify import asd_verify
from asd_jax.calibrate import calibrate_asd, first_rejection_ratios


def round_with_first_rejections(regrets, positions, k=4, v=6):
  """One round, one row per entry: exact matches before `position`, then a mismatch of the
  given regret (None: no rejection at all)."""
  b = len(regrets)
  z = np.zeros((b, k + 1, v), np.float32)
  z[:, :, 0] = 4.0                      # target argmax 0 everywhere
  draft = np.zeros((b, k), np.int32)
  for row, (r, pos) in enumerate(zip(regrets, positions)):
    if r is not None:
      draft[row, pos] = 1
      z[row, pos, 1] = 4.0 - r
      draft[row, pos + 1:] = 2          # later mismatches must not count
  return draft, z


def test_ratios_by_hand():
  # K = 4; normalised q at position i is (4 - i)/4.
  draft, z = round_with_first_rejections([0.5, 1.0, None, 3.0], [0, 2, 0, 3])
  ratios = first_rejection_ratios([draft], [z])
  np.testing.assert_allclose(ratios, [0.5 / 1.0, 1.0 / 0.5, 3.0 / 0.25])
  raw = first_rejection_ratios([draft], [z], normalize_q=False)
  np.testing.assert_allclose(raw, [0.5 / 4, 1.0 / 2, 3.0 / 1])


def test_calibrate_q25_over_rounds_of_different_shapes():
  r1 = round_with_first_rejections([0.5, 1.0, None], [0, 2, 0])          # ratios 0.5, 2.0
  r2 = round_with_first_rejections([0.25, 0.75], [0, 0], k=2, v=3)       # ratios 0.25, 0.75
  cfg = calibrate_asd([r1[0], r2[0]], [r1[1], r2[1]])
  want = float(np.quantile([0.5, 2.0, 0.25, 0.75], 0.25))
  assert cfg == ASDConfig(budget=want, gate=want, max_exceptions=1, normalize_q=True)
  assert calibrate_asd([r1[0]], [r1[1]], quantile=1.0).budget == 2.0


def test_nonfinite_rows_are_skipped_and_empty_calibration_is_an_error():
  draft, z = round_with_first_rejections([0.5, 1.0], [0, 0])
  z[1, 3, 2] = np.nan
  np.testing.assert_allclose(first_rejection_ratios([draft], [z]), [0.5])
  draft, z = round_with_first_rejections([None, None], [0, 0])
  with pytest.raises(ValueError, match="no strict rejection"):
    calibrate_asd([draft], [z])
  with pytest.raises(ValueError, match="rounds"):
    calibrate_asd([draft, draft], [z])
  with pytest.raises(ValueError, match="quantile"):
    calibrate_asd([draft], [z], quantile=1.5)


def test_calibrated_gate_admits_about_a_quarter_of_first_rejections():
  rng = np.random.default_rng(0)
  rounds = [round_with_first_rejections(list(rng.uniform(0.05, 3.0, 8)),
                                        list(rng.integers(0, 4, 8))) for _ in range(32)]
  cfg = calibrate_asd(*zip(*rounds))
  ratios = first_rejection_ratios(*zip(*rounds))
  assert 0.2 <= np.mean(ratios <= cfg.gate) <= 0.3
  # With a full ledger, ASD then accepts past exactly those first rejections.
  passed = []
  for draft, z in rounds:
    out = asd_verify(draft, z, np.zeros(len(draft)), cfg)
    passed.append(np.asarray(out.num_exceptions) == 1)
  assert np.mean(np.concatenate(passed)) <= 0.3


def test_all_nonfinite_rounds_are_named_in_the_error():
  draft, z = round_with_first_rejections([0.5, 1.0], [0, 1])
  z[:, 2, 3] = np.nan
  with pytest.raises(ValueError, match=r"2 of 2 rows \(in 1 rounds\) had non-finite"):
    calibrate_asd([draft], [z])
  draft, z = round_with_first_rejections([None, None], [0, 0])
  with pytest.raises(ValueError, match="no strict rejection") as e:
    calibrate_asd([draft], [z])
  assert "non-finite" not in str(e.value)  # nothing was skipped: do not blame NaN


def test_infinite_quantile_warns():
  draft, z = round_with_first_rejections([0.5, 1.0, 1.0, 1.0, 1.0], [0, 0, 1, 2, 3])
  z[1:, :, 1] = -np.inf  # four of five rejected ids have -inf logit: q25 is infinite
  with pytest.warns(RuntimeWarning, match="float32 max"):
    cfg = calibrate_asd([draft], [z])
  assert cfg.budget == float(np.finfo(np.float32).max)
