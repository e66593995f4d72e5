"""min_tokens, logit_bias and allowed_token_ids (asd_jax/logit_edits.py) in every engine.

By-hand values; plain decoding against a float64 reference loop; strict chain, n-gram, tree and
tree-ASD-at-budget-0 decoding equal plain decoding (the check fails when a round's rows ignore
their drafted context's length); ASD's budget never buys an EOS that min_tokens holds back; the
target drafting for itself accepts every draft; speculative sampling stays lossless; stop
strings wait for min_tokens too; bad values are refused before anything runs.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import (SamplingConfig, TreeShape, asd_decode, asd_tree_decode, lm_chain_drafter,
                     lm_tree_drafter, plain_decode)
from asd_jax import logit_edits
from asd_jax.asd_config import ASDConfig, PAPER
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.sampling import probabilities
from asd_jax.stop_strings import StopStrings
from models.lm_fns import decoder_fns
from tests.test_penalties import _DRAFT_PARAMS, _FNS, _LENGTHS, _PARAMS, _PROMPT, VOCAB
from tests.test_spec_decode_sampling import _tv, TV_LIMIT
from tests.tiny_models import perturbed_copy, random_decoder

MAX_NEW = 24


def _greedy_tokens(**kw):
  return np.asarray(plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                                 **kw).tokens_BxN)


# The EOS ids of these tests: each greedy answer's second token, so that unconstrained every
# row ends within two tokens and holding them back changes every row.
_FREE = _greedy_tokens()
_EOS = tuple(sorted(set(_FREE[:, 1].tolist())))
# A bias that moves greedy choices: favour a token the answers never pick, punish an EOS.
_BIAS = {int(np.setdiff1d(np.arange(VOCAB), _FREE)[0]): 3.0, _EOS[0]: -1.5}
# Tokens the answers may hold: every other id, the EOS ids among them.
_ALLOWED = tuple(range(0, VOCAB, 2)) + _EOS
SETTINGS = [dict(min_tokens=6), dict(min_tokens=MAX_NEW), dict(logit_bias=_BIAS),
            dict(min_tokens=9, logit_bias=_BIAS, repetition_penalty=1.3),
            dict(allowed_token_ids=_ALLOWED, min_tokens=4)]


def reference_step(z, output, min_tokens=0, logit_bias=None, repetition_penalty=1.0,
                   allowed_token_ids=None, prompt=()):
  """float64 logits after the edits, token by token (bias, repetition penalty, EOS ban,
  allowed ids)."""
  z = np.array(z, np.float64)
  for token, bias in (logit_bias or {}).items():
    z[token] += bias
  for token in set(prompt) | set(output):
    z[token] = z[token] / repetition_penalty if z[token] > 0 else z[token] * repetition_penalty
  if len(output) < min_tokens:
    z[list(_EOS)] = -np.inf
  if allowed_token_ids is not None:
    z[[t for t in range(len(z)) if t not in allowed_token_ids]] = -np.inf
  return z


def test_eos_appears_early_without_min_tokens():
  """The premise of the tests below: unconstrained, every row ends within a few tokens."""
  out = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW, eos_ids=_EOS)
  assert (np.asarray(out.num_generated_B) <= 2).all(), np.asarray(out.num_generated_B)


def test_penalize_by_hand():
  z = jnp.array([[[2.0, -1.0, 0.5, jnp.nan]] * 4] * 2)  # B=2 rows, R=4 logits rows, V=4
  setting = logit_edits.LogitEdits.of(min_tokens=3, eos_ids=(2, 3), logit_bias={0: -2.5, 1: 1.0},
                                      vocab_size=4)
  counts = logit_edits.add_output(logit_edits.count_prompt(jnp.zeros((2, 1), jnp.int32),
                                                         jnp.array([1, 1]), 4, setting),
                                  jnp.array([[1], [1]]), jnp.array([[True], [False]]))
  draft = jnp.array([[0, 1, 0], [0, 1, 0]])
  got = np.asarray(logit_edits.edit_logits(z, counts, setting, logit_edits.chain_context(draft)))
  # Row 0 has 1 output token: logits rows 0, 1 (answer lengths 1, 2) hold EOS 2 back.
  # Row 1 has none: rows 0-2 (lengths 0-2) hold it back. The NaN (id 3) always passes.
  for b, banned_rows in ((0, 2), (1, 3)):
    for r in range(4):
      want = [-0.5, 0.0, -np.inf if r < banned_rows else 0.5]
      np.testing.assert_allclose(got[b, r, :3], want, err_msg=f"row {b} logits row {r}")
      assert np.isnan(got[b, r, 3])
  # allowed_token_ids: every other token is -inf, a NaN still passes.
  only = logit_edits.LogitEdits.of(allowed_token_ids=[1, 3], vocab_size=4)
  got = np.asarray(logit_edits.edit_logits(z[:, 0], None, only))
  assert (got[:, [0, 2]] == -np.inf).all() and (got[:, 1] == -1.0).all()
  assert np.isnan(got[:, 3]).all()
  # No EOS ids (--ignore-eos) or min_tokens 0: nothing is held back.
  assert not logit_edits.LogitEdits.of(min_tokens=3).on
  assert not logit_edits.LogitEdits.of(eos_ids=(2,)).on


@pytest.mark.parametrize("setting", SETTINGS)
def test_plain_decoding_follows_the_reference_loop(setting):
  out = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW, eos_ids=_EOS,
                     sampling=SamplingConfig(**setting))
  forward = jax.jit(_FNS.forward)
  for b, n in enumerate(_LENGTHS):
    ids = _PROMPT[b, :n].tolist()
    while len(ids) - n < MAX_NEW and (len(ids) == n or ids[-1] not in _EOS):
      logits = forward(_PARAMS, jnp.asarray([ids]), jnp.arange(len(ids))[None],
                       _FNS.init_cache(1, 64))[0][0, -1]
      ids.append(int(np.argmax(reference_step(logits, ids[n:], prompt=_PROMPT[b, :n].tolist(),
                                              **setting))))
    k = int(out.num_generated_B[b])
    assert np.asarray(out.tokens_BxN[b, :k]).tolist() == ids[n:], (b, setting)
    if "min_tokens" in setting:
      assert k >= setting["min_tokens"]
      assert not set(_EOS) & set(ids[n:n + setting["min_tokens"] - 1])
    if "allowed_token_ids" in setting:
      assert set(ids[n:]) <= set(_ALLOWED) and not set(ids[n:]) <= set(_EOS)


def _engines(eos):
  tree = lm_tree_drafter(_FNS, TreeShape(4, 3, 12))
  common = dict(max_new_tokens=MAX_NEW, eos_ids=eos)
  return {
      "chain K=4": lambda s: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 4), _DRAFT_PARAMS,
                                        _PROMPT, _LENGTHS, sampling=s, **common),
      "ngram K=4": lambda s: asd_decode(_FNS, _PARAMS, ngram_drafter(4, VOCAB), None, _PROMPT,
                                        _LENGTHS, sampling=s, **common),
      "tree 4,3,12": lambda s: asd_tree_decode(_FNS, _PARAMS, tree, _DRAFT_PARAMS, _PROMPT,
                                               _LENGTHS, sampling=s, **common),
      "tree asd B=0": lambda s: asd_tree_decode(
          _FNS, _PARAMS, tree, _DRAFT_PARAMS, _PROMPT, _LENGTHS, sampling=s, rule="asd",
          asd_config=ASDConfig(0.0, 0.5, 2), **common),
  }


def _assert_same(got, want, msg):
  np.testing.assert_array_equal(np.asarray(got.num_generated_B), np.asarray(want.num_generated_B),
                                err_msg=msg)
  np.testing.assert_array_equal(np.asarray(got.tokens_BxN), np.asarray(want.tokens_BxN),
                                err_msg=msg)


@pytest.mark.parametrize("engine", ["chain K=4", "ngram K=4", "tree 4,3,12", "tree asd B=0"])
def test_strict_speculative_decoding_equals_plain_decoding(engine):
  decode = _engines(_EOS)[engine]
  for setting in SETTINGS:
    sampling = SamplingConfig(**setting)
    want = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                        eos_ids=_EOS, sampling=sampling)
    _assert_same(decode(sampling), want, f"{engine} {setting}")


def engines_ignoring_drafted_context(monkeypatch, eos):
  """Chain and tree engines, the target drafting for itself, whose rounds give every logits row
  the committed output only as context (not draft[:j], not the node's path): what the equality
  checks of the logit edits must catch (their controls)."""
  from asd_jax import spec_decode, tree_decode
  monkeypatch.setattr(spec_decode.logit_edits, "chain_context",
                      lambda d: jnp.full((d.shape[0], d.shape[1] + 1, 1), -1, jnp.int32))
  monkeypatch.setattr(tree_decode.logit_edits, "tree_context",
                      lambda t, p: jnp.full((t.shape[0], t.shape[1] + 1, 1), -1, jnp.int32))
  chain = dataclasses.replace(lm_chain_drafter(_FNS, 4))  # new static args: traced again
  tree = dataclasses.replace(lm_tree_drafter(_FNS, TreeShape(4, 3, 12)))
  return {
      "chain": lambda s: asd_decode(_FNS, _PARAMS, chain, _PARAMS, _PROMPT, _LENGTHS,
                                    max_new_tokens=MAX_NEW, eos_ids=eos, sampling=s),
      "tree": lambda s: asd_tree_decode(_FNS, _PARAMS, tree, _PARAMS, _PROMPT, _LENGTHS,
                                        max_new_tokens=MAX_NEW, eos_ids=eos, sampling=s)}


def test_the_equality_check_fails_when_rows_ignore_their_drafted_length(monkeypatch):
  """Rounds whose rows read only the committed length (not draft[:j]'s, not the node's path's)
  hold an EOS back where plain decoding chooses it, and must fail the equality above: the
  control. (The target drafts for itself, so rounds run through the min_tokens-th token.)"""
  for name, decode in engines_ignoring_drafted_context(monkeypatch, _EOS).items():
    failures = 0
    for min_tokens in range(3, 9):
      sampling = SamplingConfig(min_tokens=min_tokens)
      want = np.asarray(plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                                     eos_ids=_EOS, sampling=sampling).tokens_BxN)
      failures += not np.array_equal(np.asarray(decode(sampling).tokens_BxN), want)
    assert failures >= 2, (name, failures)


def test_asd_never_spends_its_budget_on_a_held_back_eos():
  """A drafted EOS before min_tokens has infinite regret: no budget, gate or cap accepts it."""
  for config in (PAPER, ASDConfig(1e6, 1e6, 8)):
    for drafter, params in ((lm_chain_drafter(_FNS, 4), _DRAFT_PARAMS),
                            (ngram_drafter(4, VOCAB), None)):
      out = asd_decode(_FNS, _PARAMS, drafter, params, _PROMPT, _LENGTHS,
                       max_new_tokens=MAX_NEW, eos_ids=_EOS, rule="asd", asd_config=config,
                       sampling=SamplingConfig(min_tokens=10))
      tok = np.asarray(out.tokens_BxN)
      assert (np.asarray(out.num_generated_B) >= 10).all()
      assert not np.isin(tok[:, :9], _EOS).any(), (config, drafter.name)


def test_the_target_drafting_for_itself_accepts_every_draft():
  """The chain and tree drafters hold the EOS back as the target does (and add the bias; a
  tree node by its path's length): every round but a row's last accepts all K drafts, or the
  top-1 tree's whole depth. Without the drafter-side edits they would not."""
  k = 4
  tree = lm_tree_drafter(_FNS, TreeShape(k, 1, k))
  for setting in SETTINGS:
    sampling = SamplingConfig(**setting)
    for out in (asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, k), _PARAMS, _PROMPT,
                           _LENGTHS, max_new_tokens=MAX_NEW, eos_ids=_EOS, sampling=sampling),
                asd_tree_decode(_FNS, _PARAMS, tree, _PARAMS, _PROMPT, _LENGTHS,
                                max_new_tokens=MAX_NEW, eos_ids=_EOS, sampling=sampling)):
      rounds, accepted = np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)
      assert (accepted >= (rounds - 1) * k).all(), (setting, rounds, accepted)


def test_sampled_answers_hold_eos_back_until_min_tokens():
  sampling = SamplingConfig(temperature=1.0, min_tokens=5, allowed_token_ids=_ALLOWED)
  prompt, lengths = np.tile(_PROMPT[:1], (64, 1)), np.tile(_LENGTHS[:1], 64)
  for out in (plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12, eos_ids=_EOS,
                           sampling=sampling, seed=np.arange(64)),
              asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 3), _DRAFT_PARAMS, prompt,
                         lengths, max_new_tokens=12, eos_ids=_EOS, rule="sample",
                         sampling=sampling, seed=np.arange(64))):
    tok, n = np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)
    assert (n >= 5).all() and not np.isin(tok[:, :4], _EOS).any()
    kept = np.arange(tok.shape[1])[None] < n[:, None]
    assert np.isin(tok[kept], _ALLOWED).all()  # and hold only the allowed ids
    assert np.isin(tok[np.arange(64), n - 1], _EOS).any()  # an EOS does end answers later


def test_speculative_sampling_is_lossless():
  """200,000 samples of chain speculative sampling at T=1 with min_tokens=2 (the 1st and 2nd
  tokens may not be EOS, the 3rd may), a logit bias and allowed_token_ids (all but two), against
  the exact law of the first three tokens."""
  from tests.test_spec_decode_sampling import PROMPT, ROWS, CALLS, V
  target = random_decoder(seed=11, vocab=V, num_layers=2, hidden=32)
  fns, params = decoder_fns(target)
  _, dparams = decoder_fns(perturbed_copy(target, 0.6, seed=3))
  t = len(PROMPT)
  ids = np.array([PROMPT + [a, b] for a in range(V) for b in range(V)], np.int32)
  logits = np.asarray(jax.jit(fns.forward)(
      params, jnp.asarray(ids), jnp.broadcast_to(jnp.arange(t + 2), ids.shape),
      fns.init_cache(ids.shape[0], t + 2))[0], np.float64)
  eos = int(np.argmax(logits[0, t - 1]))  # the likeliest first token
  bias = {(eos + 1) % V: 1.5, (eos + 2) % V: -2.0}
  allowed = [t for t in range(V) if t not in ((eos + 3) % V, (eos + 4) % V)]

  def law(z, output_length):
    z = z.copy()
    for token, b in bias.items():
      z[token] += b
    if output_length < 2:
      z[eos] = -np.inf
    z[[t for t in range(V) if t not in allowed]] = -np.inf
    return np.asarray(probabilities(jnp.asarray(z[None], jnp.float32),
                                    SamplingConfig(temperature=1.0)), np.float64)[0]

  p1 = law(logits[0, t - 1], 0)
  p2 = np.stack([law(logits[a * V, t], 1) for a in range(V)])
  p3 = np.stack([law(logits[a * V + b, t + 1], 2) for a in range(V) for b in range(V)])
  exact = p1[:, None, None] * p2[:, :, None] * p3.reshape(V, V, V)
  unedited = np.asarray(probabilities(jnp.asarray(logits[0, t - 1][None], jnp.float32),
                                      SamplingConfig(temperature=1.0)))[0]
  assert _tv(exact.sum(axis=(1, 2)), unedited) > 5 * TV_LIMIT  # the edits matter here
  sampling = SamplingConfig(temperature=1.0, min_tokens=2, logit_bias=bias,
                            allowed_token_ids=allowed)
  counts = np.zeros((V, V, V))
  for call in range(CALLS):
    out = asd_decode(fns, params, lm_chain_drafter(fns, 2), dparams,
                     np.tile([PROMPT], (ROWS, 1)), np.full((ROWS,), t), max_new_tokens=3,
                     rule="sample", sampling=sampling, eos_ids=(eos,), seed=7 + call,
                     capacity=16)
    tok = np.asarray(out.tokens_BxN)
    assert (tok >= 0).all()  # no row ended before its third token
    np.add.at(counts, (tok[:, 0], tok[:, 1], tok[:, 2]), 1)
  got = counts / counts.sum()
  assert _tv(got.sum(axis=2), exact.sum(axis=2)) <= TV_LIMIT
  assert _tv(got.sum(axis=0), exact.sum(axis=0)) <= TV_LIMIT


def _letters(ids):
  return "".join(chr(ord("a") + i % 26) for i in ids)


def test_a_stop_string_counts_only_from_min_tokens_on():
  """A stop string completed by a token before the min_tokens-th is not a stop: the answer
  goes on to the next one (vLLM checks none before min_tokens). Here each token shows as one
  letter, and the stop string is a letter the greedy answer holds twice."""
  free = _greedy_tokens()[0].tolist()
  text = _letters(free)
  letter = next(c for c in text if text.count(c) >= 2)
  first, second = text.index(letter), text.index(letter, text.index(letter) + 1)
  stop = StopStrings((letter,), _letters)
  for min_tokens, ends_after in ((0, first), (first + 1, first), (first + 2, second)):
    out = plain_decode(_FNS, _PARAMS, _PROMPT[:1], _LENGTHS[:1], max_new_tokens=MAX_NEW,
                       stop=stop, sampling=SamplingConfig(min_tokens=min_tokens))
    n = int(out.num_generated_B[0])
    assert np.asarray(out.tokens_BxN[0, :n]).tolist() == free[:ends_after + 1], min_tokens
    # What the answer shows: the text before the stop string that ended it.
    assert stop.cut(text[:n], stop.min_tokens_chars(free[:n], min_tokens)) == text[:ends_after]


@pytest.mark.parametrize("kwargs,match", [
    (dict(min_tokens=-1), "min_tokens"), (dict(min_tokens=True), "min_tokens"),
    (dict(min_tokens=2.0), "min_tokens"), (dict(logit_bias={3: 100.5}), r"\[-100, 100\]"),
    (dict(logit_bias={3: np.nan}), r"\[-100, 100\]"), (dict(logit_bias={-1: 1.0}), "token id"),
    (dict(logit_bias={"3": 1.0}), "token id"), (dict(logit_bias=[(3, 1.0), (3, 2.0)]), "twice"),
    (dict(logit_bias=5), "logit_bias"), (dict(logit_bias=[(3,)]), "logit_bias"),
    (dict(allowed_token_ids=[]), "allowed_token_ids is empty"),
    (dict(allowed_token_ids=[1, -2]), "allowed_token_ids: a token id must be an integer >= 0"),
    (dict(allowed_token_ids="12"), "allowed_token_ids must be a list of token ids"),
    (dict(allowed_token_ids=[1.0]), "allowed_token_ids: a token id")])
def test_bad_settings_are_refused(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kwargs)


def test_settings_the_model_cannot_honour_are_refused_before_decoding():
  with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 97\)"):
    plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                 sampling=SamplingConfig(logit_bias={97: 1.0}))
  with pytest.raises(ValueError, match=r"token id 97 outside the vocabulary \[0, 97\)"):
    plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                 sampling=SamplingConfig(allowed_token_ids=[3, 97]))
  with pytest.raises(ValueError, match="holds only EOS ids, which min_tokens holds back"):
    plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8, eos_ids=(3, 4),
                 sampling=SamplingConfig(allowed_token_ids=[3], min_tokens=2))
  for decode in (lambda s: plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                                        sampling=s),
                 lambda s: asd_decode(_FNS, _PARAMS, ngram_drafter(4, VOCAB), None, _PROMPT,
                                      _LENGTHS, max_new_tokens=8, sampling=s)):
    with pytest.raises(ValueError, match=r"min_tokens \(9\) is more than max_new_tokens \(8\)"):
      decode(SamplingConfig(min_tokens=9))
  # A dict and its pairs are the same setting.
  assert SamplingConfig(logit_bias={5: 1, 2: -3.5}) == SamplingConfig(
      logit_bias=((2, -3.5), (5, 1.0)))
