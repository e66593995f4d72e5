"""Non-finite logits (NaN, +inf, all -inf) from the target or the drafter: a defined outcome
per row, never a silently emitted token.

Target: the row stops with nonfinite_B set; what it emitted is a prefix of the clean output and
the token the bad logits would have chosen is not emitted. Other rows are untouched.
Drafter: under strict/asd every drafted token is verified by the target, so the output is the
clean target output; under rule="sample" the row stops with nonfinite_B set (no valid q).
"""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.spec_decode import asd_decode
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.fake_lm import fake_lm
from tests.tiny_models import perturbed_copy, random_decoder

V = 61
_TARGET = random_decoder(seed=31, vocab=V, num_layers=1, hidden=32)
_TFNS, _TPARAMS = decoder_fns(_TARGET)
_DPARAMS = decoder_fns(perturbed_copy(_TARGET, 0.4, seed=2))[1]
POISON_FROM = 12  # logits of query positions >= this are bad
PROMPT = np.array([[4, 8, 15, 16, 23, 42, 7, 9], [5, 6, 0, 0, 0, 0, 0, 0]], np.int32)
LENGTHS = np.array([8, 2], np.int32)
MAX_NEW_B = np.array([10, 3], np.int32)  # row 1 never reaches POISON_FROM (even with lookahead)
BAD = {"nan": jnp.nan, "+inf": jnp.inf, "-inf": -jnp.inf}


def _bad_logits(logits, positions, value):
  bad = (positions >= POISON_FROM)[..., None]
  if value == -jnp.inf:  # a whole row of -inf has no maximum
    return jnp.where(bad, -jnp.inf, logits)
  # One bad entry is enough (a NaN/+inf anywhere in the row).
  return jnp.where(bad & (jnp.arange(logits.shape[-1]) == 3), value, logits)


def poisoned(fns, value, from_position=True):
  """The same model, whose logits at query positions >= POISON_FROM hold `value`."""

  def forward(params, tokens, positions, cache):
    logits, hidden, cache = fns.forward(params, tokens, positions, cache)
    return _bad_logits(logits, positions, value), hidden, cache

  def prefill(params, tokens, lengths, cache):
    logits, hidden, cache = fns.prefill(params, tokens, lengths, cache)
    return _bad_logits(logits, lengths - 1, value), hidden, cache

  def tree_forward(params, tokens, positions, slots, visible, cache):
    logits, hidden, cache = fns.tree_forward(params, tokens, positions, slots, visible, cache)
    return _bad_logits(logits, positions, value), hidden, cache

  return dataclasses.replace(fns, forward=forward, prefill=prefill, tree_forward=tree_forward,
                             name=f"{fns.name}-bad")


def _clean(max_new=10):
  return np.asarray(plain_decode(_TFNS, _TPARAMS, PROMPT, LENGTHS, max_new_tokens=max_new,
                                 max_new_B=MAX_NEW_B, capacity=64).tokens_BxN)


def _check_stopped(out, clean, exact_count=None):
  tokens, n = np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)
  assert np.asarray(out.nonfinite_B).tolist() == [True, False]
  # Row 0 emitted a prefix of the clean output, at most up to the last finite position.
  limit = POISON_FROM - LENGTHS[0] + 1
  assert n[0] <= limit and (exact_count is None or n[0] == exact_count)
  np.testing.assert_array_equal(tokens[0, :n[0]], clean[0, :n[0]])
  assert (tokens[0, n[0]:] == -1).all()
  np.testing.assert_array_equal(tokens[1], clean[1])  # the other row is untouched


@pytest.mark.parametrize("value", BAD)
def test_plain_decode_stops_exactly_before_the_bad_token(value):
  out = plain_decode(poisoned(_TFNS, BAD[value]), _TPARAMS, PROMPT, LENGTHS, max_new_tokens=10,
                     max_new_B=MAX_NEW_B, capacity=64)
  _check_stopped(out, _clean(), exact_count=POISON_FROM - LENGTHS[0] + 1)


CHAIN = {"strict": {}, "asd": dict(asd_config=ASDConfig(4.0, 0.5, 2)),
         "sample": dict(sampling=SamplingConfig(temperature=1.0))}
_POISONED = {v: poisoned(_TFNS, BAD[v]) for v in BAD}  # one object each: no recompiles
# Chain tests use the fake LM (predicts token + 1), cheap to compile; the same fake drafts.
_FAKE = fake_lm(V)
_FAKE_POISONED = {v: poisoned(_FAKE, BAD[v]) for v in BAD}
_CHAIN_DRAFTER = lm_chain_drafter(fake_lm(V, shift=1), 3)


def _chain(target, rule, drafter=_CHAIN_DRAFTER):
  return asd_decode(target, None, drafter, None, PROMPT, LENGTHS, max_new_tokens=10,
                    max_new_B=MAX_NEW_B, rule=rule, capacity=64, **CHAIN[rule])


@pytest.mark.parametrize("rule, value", [("strict", "nan"), ("strict", "+inf"),
                                         ("strict", "-inf"), ("asd", "nan"), ("sample", "nan")])
def test_chain_target_nonfinite_stops_the_row(rule, value):
  out = _chain(_FAKE_POISONED[value], rule)
  if rule == "sample":  # sampled tokens differ from greedy; check the flag and the bound only
    n = np.asarray(out.num_generated_B)
    assert np.asarray(out.nonfinite_B).tolist() == [True, False]
    assert n[0] <= POISON_FROM - LENGTHS[0] + 1 and n[1] == MAX_NEW_B[1]
    assert (np.asarray(out.tokens_BxN)[0, n[0]:] == -1).all()
  else:
    _check_stopped(out, np.asarray(_chain(_FAKE, rule).tokens_BxN))


@pytest.mark.parametrize("value", BAD)
def test_tree_target_nonfinite_stops_the_row(value):
  out = asd_tree_decode(_POISONED[value], _TPARAMS, lm_tree_drafter(_TFNS, TreeShape(2, 2, 4)),
                        _DPARAMS, PROMPT, LENGTHS, max_new_tokens=10, max_new_B=MAX_NEW_B,
                        capacity=64)
  _check_stopped(out, _clean())


def test_broken_drafter_under_greedy_rules_cannot_change_the_output():
  out = _chain(_FAKE, "strict", lm_chain_drafter(_FAKE_POISONED["nan"], 3))
  assert not np.asarray(out.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(
      _chain(_FAKE, "strict").tokens_BxN))
  out = asd_tree_decode(_TFNS, _TPARAMS, lm_tree_drafter(_POISONED["+inf"], TreeShape(2, 2, 4)),
                        _DPARAMS, PROMPT, LENGTHS, max_new_tokens=10, max_new_B=MAX_NEW_B,
                        capacity=64)
  assert not np.asarray(out.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), _clean())


def test_broken_drafter_under_asd_is_verified_by_the_target():
  """ASD only reads the draft's tokens, scored by the (finite) target: no flag, a full answer
  of in-vocabulary tokens, and the ledger within its budget."""
  out = _chain(_FAKE, "asd", lm_chain_drafter(_FAKE_POISONED["nan"], 3))
  assert not np.asarray(out.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(out.num_generated_B), MAX_NEW_B)
  tokens = np.asarray(out.tokens_BxN)
  assert ((tokens[0] >= 0) & (tokens[0] < V)).all()
  assert (np.asarray(out.stats.asd_spent_B) <= CHAIN["asd"]["asd_config"].budget).all()


def test_broken_drafter_under_sampling_stops_the_row():
  out = _chain(_FAKE, "sample", lm_chain_drafter(_FAKE_POISONED["nan"], 3))
  n = np.asarray(out.num_generated_B)
  assert np.asarray(out.nonfinite_B).tolist() == [True, False]
  assert n[0] <= POISON_FROM - LENGTHS[0] + 1 and n[1] == MAX_NEW_B[1]
  out = asd_tree_decode(_TFNS, _TPARAMS, lm_tree_drafter(_POISONED["nan"], TreeShape(2, 2, 4)),
                        _DPARAMS, PROMPT, LENGTHS, max_new_tokens=10, max_new_B=MAX_NEW_B,
                        rule="sample", sampling=SamplingConfig(temperature=1.0), capacity=64)
  n = np.asarray(out.num_generated_B)
  assert np.asarray(out.nonfinite_B).tolist() == [True, False]  # the tree's q is NaN too
  assert n[0] <= POISON_FROM - LENGTHS[0] + 1 and n[1] == MAX_NEW_B[1]
