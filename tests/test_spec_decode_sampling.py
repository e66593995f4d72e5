"""End-to-end losslessness of `asd_decode(rule="sample")` on a tiny model (vocabulary 16).

The exact joint distribution of the first three generated tokens is computed from the target
by brute force; speculative sampling must match it (total variation), and the test is shown
to have the power to fail with a sampler that trusts the drafter.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.sampling import SamplingConfig, probabilities
from asd_jax.spec_decode import asd_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder

V = 16
PROMPT = [3, 7, 1]
ROWS = 50_000
CALLS = 4  # 200,000 samples per setting: sampling noise alone gives TV ~0.012 here
TV_LIMIT = 0.02


def _exact_joint(fns, params, sampling, prompt=PROMPT):
  """P(t1, t2, t3 | prompt) under the filtered target, float64 [V, V, V]."""
  forward = jax.jit(fns.forward)
  t = len(prompt)
  ids = np.array([list(prompt) + [a, b] for a in range(V) for b in range(V)], np.int32)
  pos = jnp.broadcast_to(jnp.arange(t + 2), ids.shape)
  logits = forward(params, jnp.asarray(ids), pos, fns.init_cache(ids.shape[0], t + 2))[0]
  p1 = np.asarray(probabilities(logits[:1, t - 1], sampling), np.float64)[0]
  p2 = np.asarray(probabilities(logits[::V, t], sampling), np.float64)  # [t1, t2]
  p3 = np.asarray(probabilities(logits[:, t + 1], sampling), np.float64).reshape(V, V, V)
  return p1[:, None, None] * p2[:, :, None] * p3


def _sampled_joint(target_fns, tparams, drafter, dparams, sampling, seed0, calls=CALLS,
                   prompt=PROMPT):
  counts = np.zeros((V, V, V))
  lengths = np.full((ROWS,), len(prompt), np.int32)
  prompt = np.tile(np.array([prompt], np.int32), (ROWS, 1))
  for call in range(calls):
    out = asd_decode(target_fns, tparams, drafter, dparams, prompt, lengths, max_new_tokens=3,
                     rule="sample", sampling=sampling, seed=seed0 + call, capacity=16)
    tok = np.asarray(out.tokens_BxN)
    assert (tok >= 0).all()
    np.add.at(counts, (tok[:, 0], tok[:, 1], tok[:, 2]), 1)
  return counts / counts.sum()


def _tv(p, q):
  return 0.5 * np.abs(p - q).sum()


@pytest.fixture(scope="module")
def pair():
  target = random_decoder(seed=11, vocab=V, num_layers=2, hidden=32)
  tfns, tparams = decoder_fns(target)
  _, dparams = decoder_fns(perturbed_copy(target, 0.6, seed=3))
  return tfns, tparams, dparams


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=1.0, top_p=0.9, min_p=0.2)])
def test_speculative_sampling_matches_the_target_distribution(pair, sampling):
  tfns, tparams, dparams = pair
  exact = _exact_joint(tfns, tparams, sampling)
  got = _sampled_joint(tfns, tparams, lm_chain_drafter(tfns, 2), dparams, sampling, seed0=1)
  # First two tokens (the first is sampled at prefill, the second by rejection sampling) and
  # the (second, third) pair, both produced inside speculative rounds.
  assert _tv(got.sum(axis=2), exact.sum(axis=2)) <= TV_LIMIT
  assert _tv(got.sum(axis=0), exact.sum(axis=0)) <= TV_LIMIT


def test_sample_rule_at_temperature_0_is_greedy_decoding(pair):
  """rule="sample" at temperature 0 (the default SamplingConfig) samples from point masses, so
  it gives strict's output and rounds, with chain and tree drafters. Greedy drafters hand the
  rule no draft distribution; this used to stop with a dtype error from inside the loop."""
  from asd_jax.draft_tree import TreeShape, lm_tree_drafter
  from asd_jax.tree_decode import asd_tree_decode
  tfns, tparams, dparams = pair
  prompt = np.array([PROMPT + [0], [5, 2, 9, 4]], np.int32)
  lengths = np.array([3, 4], np.int32)
  chain, tree = lm_chain_drafter(tfns, 2), lm_tree_drafter(tfns, TreeShape(2, 2, 3))
  for decode, drafter in ((asd_decode, chain), (asd_tree_decode, tree)):
    strict, sample = (decode(tfns, tparams, drafter, dparams, prompt, lengths,
                             max_new_tokens=12, rule=rule) for rule in ("strict", "sample"))
    np.testing.assert_array_equal(np.asarray(sample.tokens_BxN), np.asarray(strict.tokens_BxN))
    np.testing.assert_array_equal(np.asarray(sample.stats.rounds_B),
                                  np.asarray(strict.stats.rounds_B))


def trust_every_draft(monkeypatch, drafter):
  """Replaces the engine's verifier by a broken sampler that accepts every draft token
  (ignoring p/q): the control a losslessness check must be able to fail. Returns a copy of
  `drafter` to decode with: the factories and decoder_fns hand out the objects earlier tests
  compiled loops for with the honest rule, and jit would reuse those programs; a new static
  argument traces the patched rule (and keeps that program away from other tests)."""
  from asd_jax import spec_decode
  honest = spec_decode._verify

  def trusting(rule, draft_BxK, draft_logits, target_logits, spent_B, *args, **kwargs):
    v = honest("sample", draft_BxK, draft_logits, target_logits, spent_B, *args, **kwargs)
    k = draft_BxK.shape[1]
    return v._replace(num_accepted=jnp.full_like(v.num_accepted, k),
                      next_token=jnp.argmax(target_logits[:, k], axis=-1).astype(jnp.int32))

  monkeypatch.setattr(spec_decode, "_verify", trusting)
  return dataclasses.replace(drafter)


def test_the_check_can_fail(pair, monkeypatch):
  """A sampler that accepts every draft token (ignoring p/q) must fail the same bound."""
  tfns, tparams, dparams = pair
  sampling = SamplingConfig(temperature=1.0)
  drafter = trust_every_draft(monkeypatch, lm_chain_drafter(tfns, 2))
  exact = _exact_joint(tfns, tparams, sampling)
  got = _sampled_joint(tfns, tparams, drafter, dparams, sampling, seed0=5, calls=2)
  assert _tv(got.sum(axis=0), exact.sum(axis=0)) > TV_LIMIT
