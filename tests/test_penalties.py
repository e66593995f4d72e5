"""Repetition, presence and frequency penalties (asd_jax/logit_edits.py) in every engine.

By-hand values; plain decoding against a float64 reference loop and against transformers'
`generate(repetition_penalty=...)`; strict chain, n-gram and tree decoding equal plain decoding
under the same penalties (the check fails when a round's rows ignore the drafted context);
speculative sampling with penalties is lossless (exact joint distribution, total variation).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import (SamplingConfig, TreeShape, asd_decode, asd_tree_decode, lm_chain_drafter,
                     lm_tree_drafter, plain_decode)
from asd_jax import logit_edits
from asd_jax.asd_config import ASDConfig
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.sampling import probabilities
from models.lm_fns import decoder_fns
from tests.test_spec_decode_sampling import _sampled_joint, _tv, TV_LIMIT
from tests.tiny_models import perturbed_copy, random_decoder

VOCAB = 97
_TARGET = random_decoder(seed=0, vocab=VOCAB)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.15, seed=3))
# Row 1 and 2 are right-padded with ids that are not theirs: padding must not count as prompt.
_PROMPT = np.array([[5, 9, 5, 40, 2, 77, 9, 9, 13, 60],
                    [11, 3, 3, 8, 90, 21, 0, 0, 0, 0],
                    [64, 64, 1, 30, 2, 2, 17, 50, 50, 50]], np.int32)
_LENGTHS = np.array([10, 6, 7], np.int32)
SETTINGS = [dict(repetition_penalty=1.5), dict(repetition_penalty=0.7),
            dict(presence_penalty=1.0, frequency_penalty=0.3),
            dict(repetition_penalty=1.3, presence_penalty=-1.0, frequency_penalty=0.5)]


def reference_penalties(z, prompt, output, repetition_penalty=1.0, presence_penalty=0.0,
                        frequency_penalty=0.0):
  """float64 logits after the penalties, written out token by token."""
  z = np.array(z, np.float64)
  for token in range(z.shape[-1]):
    count = list(output).count(token)
    if token in prompt or count:
      z[token] = z[token] / repetition_penalty if z[token] > 0 else z[token] * repetition_penalty
    z[token] -= frequency_penalty * count + presence_penalty * (count > 0)
  return z


def _penalties(setting):
  return SamplingConfig(**setting).logit_edits()


def test_penalize_by_hand():
  z = jnp.array([[2.0, -2.0, 1.0, -1.0, 3.0, 0.5]])
  setting = logit_edits.LogitEdits.of(2.0, 0.5, 0.25)
  # Prompt [0, 1] padded with a 4.
  counts = logit_edits.count_prompt(jnp.array([[0, 1, 4]]), jnp.array([2]), 6, setting)
  counts = logit_edits.add_output(counts, jnp.array([[2, 3, 3, 5]]),
                                  jnp.array([[True, True, True, False]]))
  got = logit_edits.edit_logits(z, counts, setting)
  # 0, 1 in the prompt; 2 once and 3 twice in the output; 4 padding; 5 not kept.
  want = [2.0 / 2, -2.0 * 2, 1.0 / 2 - 0.25 - 0.5, -1.0 * 2 - 0.5 - 0.5, 3.0, 0.5]
  np.testing.assert_allclose(np.asarray(got)[0], want, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(got)[0], reference_penalties(
      z[0], [0, 1], [2, 3, 3], 2.0, 0.5, 0.25), rtol=1e-6)
  # Off: the logits themselves, dtype included.
  off = logit_edits.edit_logits(z.astype(jnp.bfloat16), None, logit_edits.OFF)
  assert off.dtype == jnp.bfloat16


def test_penalize_rows_count_their_context():
  rng = np.random.RandomState(0)
  z = rng.randn(2, 4, 12).astype(np.float32)
  prompt, lengths = np.array([[1, 2, 3], [4, 4, 0]]), np.array([3, 2])
  setting = dict(repetition_penalty=1.7, presence_penalty=0.4, frequency_penalty=0.9)
  counts = logit_edits.add_output(
      logit_edits.count_prompt(prompt, lengths, 12, _penalties(setting)),
      np.array([[5, 6], [7, 0]]), np.array([[True, True], [True, False]]))
  draft = np.array([[6, 8, 8], [9, 1, 4]], np.int32)
  got = np.asarray(logit_edits.edit_logits(z, counts, _penalties(setting),
                                           logit_edits.chain_context(draft)))
  for b, output in enumerate(([5, 6], [7])):
    for j in range(4):  # row j sees draft[:j]
      want = reference_penalties(z[b, j], prompt[b, :lengths[b]].tolist(),
                                 output + draft[b, :j].tolist(), **setting)
      np.testing.assert_allclose(got[b, j], want, rtol=1e-5, atol=1e-6)
  # A tree's rows: node n's path from the root (tree_verify.tree_paths' layout).
  paths = np.array([[[0, -1], [0, 1], [2, -1]]], np.int32)
  ctx = np.asarray(logit_edits.tree_context(np.array([[3, 7, 9]], np.int32), paths))
  np.testing.assert_array_equal(ctx, [[[-1, -1], [3, -1], [3, 7], [9, -1]]])


def test_nonfinite_logits_pass_through_and_extremes_saturate():
  z = jnp.array([[jnp.nan, jnp.inf, -jnp.inf, 4.0, -4.0]])
  setting = logit_edits.LogitEdits.of(1e-38)
  counts = logit_edits.count_prompt(jnp.array([[0, 1, 2, 3, 4]]), jnp.array([5]), 5, setting)
  got = np.asarray(logit_edits.edit_logits(z, counts, setting))
  assert np.isnan(got[0, 0]) and got[0, 1] == np.inf and got[0, 2] == -np.inf
  # 4 / 1e-38 is past float32's range: the largest float32, not inf (softmax would give NaN).
  assert got[0, 3] == np.finfo(np.float32).max and np.isfinite(got[0, 4])


@pytest.mark.parametrize("setting", SETTINGS)
def test_plain_decoding_follows_the_reference_loop(setting):
  """Each row alone, full uncached forwards, float64 penalties: the definition."""
  out = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=16,
                     sampling=SamplingConfig(**setting))
  forward = jax.jit(_FNS.forward)
  for b, n in enumerate(_LENGTHS):
    ids = _PROMPT[b, :n].tolist()
    for _ in range(16):
      logits = forward(_PARAMS, jnp.asarray([ids]), jnp.arange(len(ids))[None],
                       _FNS.init_cache(1, 32))[0][0, -1]
      ids.append(int(np.argmax(reference_penalties(
          logits, _PROMPT[b, :n].tolist(), ids[n:], **setting))))
    assert np.asarray(out.tokens_BxN[b]).tolist() == ids[n:], (b, setting)
  # The setting matters here: without it the greedy answers differ.
  plain = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=16)
  assert not np.array_equal(np.asarray(plain.tokens_BxN), np.asarray(out.tokens_BxN))


def test_repetition_penalty_matches_transformers_generate():
  torch = pytest.importorskip("torch")
  from tests.tiny_models import flax_from_hf, hf_model, VOCAB as HF_VOCAB
  ref_model = hf_model("llama_tied", num_layers=2)
  fns, params = decoder_fns(flax_from_hf(ref_model))
  prompt = np.random.RandomState(4).randint(0, HF_VOCAB, size=(1, 9)).astype(np.int32)
  for penalty in (1.4, 0.8):
    out = plain_decode(fns, params, prompt, np.array([9]), max_new_tokens=24,
                       sampling=SamplingConfig(repetition_penalty=penalty))
    with torch.no_grad():
      ref = ref_model.generate(torch.tensor(prompt, dtype=torch.long), max_new_tokens=24,
                               do_sample=False, repetition_penalty=penalty,
                               eos_token_id=None, pad_token_id=0)
    assert np.asarray(out.tokens_BxN[0]).tolist() == ref[0, 9:].tolist(), penalty


def _strict_engines():
  tree = lm_tree_drafter(_FNS, TreeShape(4, 3, 12))
  return {
      "chain K=4": lambda s: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 4), _DRAFT_PARAMS,
                                        _PROMPT, _LENGTHS, max_new_tokens=30, sampling=s),
      "ngram K=4": lambda s: asd_decode(_FNS, _PARAMS, ngram_drafter(4, VOCAB), None, _PROMPT,
                                        _LENGTHS, max_new_tokens=30, sampling=s),
      "tree 4,3,12": lambda s: asd_tree_decode(_FNS, _PARAMS, tree, _DRAFT_PARAMS, _PROMPT,
                                               _LENGTHS, max_new_tokens=30, sampling=s),
      "tree asd B=0": lambda s: asd_tree_decode(
          _FNS, _PARAMS, tree, _DRAFT_PARAMS, _PROMPT, _LENGTHS, max_new_tokens=30, sampling=s,
          rule="asd", asd_config=ASDConfig(0.0, 0.5, 2)),  # budget 0: strict's output
  }


@pytest.mark.parametrize("engine", ["chain K=4", "ngram K=4", "tree 4,3,12", "tree asd B=0"])
def test_strict_speculative_decoding_equals_plain_decoding_with_penalties(engine):
  decode = _strict_engines()[engine]
  for setting in SETTINGS:
    sampling = SamplingConfig(**setting)
    want = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=30, sampling=sampling)
    got = decode(sampling)
    np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN),
                                  err_msg=f"{engine} {setting}")


def test_the_equality_check_fails_when_rounds_ignore_the_drafted_context(monkeypatch):
  """Rounds whose rows see only the committed output (not draft[:j], not the node's path)
  must fail the equality above: the control that shows the check has the power to."""
  from asd_jax import spec_decode, tree_decode
  monkeypatch.setattr(spec_decode.logit_edits, "chain_context",
                      lambda d: jnp.full((d.shape[0], d.shape[1] + 1, 1), -1, jnp.int32))
  monkeypatch.setattr(tree_decode.logit_edits, "tree_context",
                      lambda t, p: jnp.full((t.shape[0], t.shape[1] + 1, 1), -1, jnp.int32))
  # Copies of the (cached) drafters: new static arguments, so the patched functions are traced
  # instead of the honest programs reused.
  chain = dataclasses.replace(lm_chain_drafter(_FNS, 4))
  tree = dataclasses.replace(lm_tree_drafter(_FNS, TreeShape(4, 3, 12)))
  engines = {
      "chain": lambda s: asd_decode(_FNS, _PARAMS, chain, _DRAFT_PARAMS, _PROMPT, _LENGTHS,
                                    max_new_tokens=30, sampling=s),
      "tree": lambda s: asd_tree_decode(_FNS, _PARAMS, tree, _DRAFT_PARAMS, _PROMPT, _LENGTHS,
                                        max_new_tokens=30, sampling=s)}
  for name, decode in engines.items():
    failures = 0
    for setting in SETTINGS:
      sampling = SamplingConfig(**setting)
      want = np.asarray(plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=30,
                                     sampling=sampling).tokens_BxN)
      failures += not np.array_equal(np.asarray(decode(sampling).tokens_BxN), want)
    assert failures >= 2, name


def test_a_language_model_drafter_drafts_under_the_penalties():
  """The target drafting for itself (a K=4 chain, or a depth-4 top-1 tree) accepts every draft token
  of every round but a row's last: its drafts are the penalized target's picks (a tree node's
  counting its path). A drafter that ignored the penalties would lose rounds wherever a penalty
  changes the target's choice."""
  k = 4
  tree = lm_tree_drafter(_FNS, TreeShape(k, 1, k))
  for setting in SETTINGS:
    sampling = SamplingConfig(**setting)
    for out in (asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, k), _PARAMS, _PROMPT,
                           _LENGTHS, max_new_tokens=30, sampling=sampling),
                asd_tree_decode(_FNS, _PARAMS, tree, _PARAMS, _PROMPT, _LENGTHS,
                                max_new_tokens=30, sampling=sampling)):
      rounds, accepted = np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)
      assert (accepted >= (rounds - 1) * k).all(), (setting, rounds, accepted)


def test_a_row_decodes_as_it_would_alone():
  sampling = SamplingConfig(**SETTINGS[3])
  together = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=12, sampling=sampling)
  for b, n in enumerate(_LENGTHS):
    alone = plain_decode(_FNS, _PARAMS, _PROMPT[b:b + 1, :n], _LENGTHS[b:b + 1],
                         max_new_tokens=12, sampling=sampling)
    np.testing.assert_array_equal(np.asarray(alone.tokens_BxN[0]),
                                  np.asarray(together.tokens_BxN[b]))


_LOSSLESS_SETTING = dict(repetition_penalty=2.0, presence_penalty=1.0, frequency_penalty=0.5)


@pytest.fixture(scope="module")
def penalized_law():
  """(fns, params, draft params, the exact joint law [V, V, V] of the first three tokens under
  the penalized target at temperature 1 with top-p 0.95: each token's logits penalized with
  the prompt and the tokens before it, in float64 by reference_penalties)."""
  from tests.test_spec_decode_sampling import PROMPT, V
  target = random_decoder(seed=11, vocab=V, num_layers=2, hidden=32)
  fns, params = decoder_fns(target)
  _, dparams = decoder_fns(perturbed_copy(target, 0.6, seed=3))
  plain_sampling = SamplingConfig(temperature=1.0, top_p=0.95)
  t = len(PROMPT)
  ids = np.array([PROMPT + [a, b] for a in range(V) for b in range(V)], np.int32)
  logits = np.asarray(jax.jit(fns.forward)(
      params, jnp.asarray(ids), jnp.broadcast_to(jnp.arange(t + 2), ids.shape),
      fns.init_cache(ids.shape[0], t + 2))[0], np.float64)

  def laws(rows, setting):  # rows: (logits, output so far); one filtered law per row
    z = np.stack([reference_penalties(z, PROMPT, output, **setting) for z, output in rows])
    return np.asarray(probabilities(jnp.asarray(z, jnp.float32), plain_sampling), np.float64)

  def joint(setting):
    p1 = laws([(logits[0, t - 1], [])], setting)[0]
    p2 = laws([(logits[a * V, t], [a]) for a in range(V)], setting)
    p3 = laws([(logits[a * V + b, t + 1], [a, b]) for a in range(V) for b in range(V)],
              setting).reshape(V, V, V)
    return p1[:, None, None] * p2[:, :, None] * p3

  exact = joint(_LOSSLESS_SETTING)
  # The penalties move the law far past the bound: ignoring them could not pass.
  assert _tv(exact.sum(axis=0), joint({}).sum(axis=0)) > 5 * TV_LIMIT
  return fns, params, dparams, exact


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_speculative_sampling_with_penalties_is_lossless(penalized_law, engine):
  """200,000 samples of speculative sampling against the exact law: the (first, second) and
  (second, third) token pairs, the latter from inside speculative rounds (a chain drafter that
  drafts under the penalties; a tree drafter that does not, whose depth-2 nodes are judged in
  their path's context)."""
  from tests.test_spec_decode_sampling import PROMPT, ROWS, CALLS, V
  fns, params, dparams, exact = penalized_law
  sampling = SamplingConfig(temperature=1.0, top_p=0.95, **_LOSSLESS_SETTING)
  if engine == "chain":
    got = _sampled_joint(fns, params, lm_chain_drafter(fns, 2), dparams, sampling, seed0=3)
  else:
    counts = np.zeros((V, V, V))
    drafter = lm_tree_drafter(fns, TreeShape(2, 2, 6))
    for call in range(CALLS):
      out = asd_tree_decode(fns, params, drafter, dparams, np.tile([PROMPT], (ROWS, 1)),
                            np.full((ROWS,), len(PROMPT)), max_new_tokens=3, rule="sample",
                            sampling=sampling, seed=3 + call, capacity=24)
      tok = np.asarray(out.tokens_BxN)
      assert (tok >= 0).all()
      np.add.at(counts, (tok[:, 0], tok[:, 1], tok[:, 2]), 1)
    got = counts / counts.sum()
  assert _tv(got.sum(axis=2), exact.sum(axis=2)) <= TV_LIMIT
  assert _tv(got.sum(axis=0), exact.sum(axis=0)) <= TV_LIMIT


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("repetition_penalty", np.nan),
    ("repetition_penalty", np.inf), ("repetition_penalty", True), ("presence_penalty", 2.5),
    ("presence_penalty", np.nan), ("frequency_penalty", -3.0), ("frequency_penalty", "1")])
def test_bad_penalties_are_refused(field, value):
  with pytest.raises(ValueError, match=field):
    SamplingConfig(**{field: value})
