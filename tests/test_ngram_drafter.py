"""The n-gram (prompt lookup) drafter: its lookup rule against a plain-Python reference, and
the engine invariants with it (strict == plain greedy, lossless sampling, repeats accepted)."""

import dataclasses
import functools

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asd_jax.ngram_drafter import lookup_draft, ngram_drafter, parse_ngram_name
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.spec_decode import asd_decode
from models.lm_fns import decoder_fns
from tests import test_spec_decode_sampling as sampling_check
from tests.fake_lm import fake_lm
from tests.test_spec_decode import _assert_equal_up_to_near_ties as assert_equal_up_to_near_ties
from tests.tiny_models import random_decoder, random_prompts


def _reference(tokens, k, max_n, min_n):
  """Longest n-gram first, then its most recent earlier end; periodic past the newest token."""
  length = len(tokens)
  for n in range(max_n, min_n - 1, -1):
    if n > length - 1:
      continue
    suffix = tokens[length - n:]
    for end in range(length - 2, n - 2, -1):
      if tokens[end - n + 1:end + 1] == suffix:
        period = length - 1 - end
        return [tokens[end + 1 + i % period] for i in range(k)]
  return [tokens[-1]] * k


def _lookup(rows, k, max_n=3, min_n=1, capacity=40, pad=-7):
  hist = np.full((len(rows), capacity), pad, np.int32)
  for b, r in enumerate(rows):
    hist[b, :len(r)] = r
  lengths = np.array([len(r) for r in rows], np.int32)
  draft, _ = lookup_draft(jnp.asarray(hist), jnp.asarray(lengths), k, max_n, min_n)
  return np.asarray(draft)


def test_hand_built_cases():
  # "5 6 7" occurred before, followed by 8 9: the trigram wins over the more recent unigram 7.
  assert _lookup([[5, 6, 7, 8, 9, 1, 7, 2, 5, 6, 7]], 2).tolist() == [[8, 9]]
  # Only unigrams match: the most recent earlier 4 (followed by 3) wins over the older one (1).
  assert _lookup([[4, 1, 4, 3, 2, 4]], 1).tolist() == [[3]]
  # A loop of period 3 is continued periodically past the newest token.
  assert _lookup([[9, 1, 2, 3, 1, 2, 3, 1]], 5).tolist() == [[2, 3, 1, 2, 3]]
  # No earlier occurrence of the last token: the row repeats it.
  assert _lookup([[1, 2, 3]], 3).tolist() == [[3, 3, 3]]
  # min_ngram=2 ignores a unigram-only match.
  assert _lookup([[4, 1, 4, 3, 2, 4]], 1, min_n=2).tolist() == [[4]]
  # One-token rows, and pads past a row's length are never matched or copied.
  assert _lookup([[6], [6, 6]], 2, pad=6).tolist() == [[6, 6], [6, 6]]


@settings(max_examples=60, deadline=None)
@given(rows=st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=30), min_size=1,
                     max_size=4),
       k=st.integers(1, 6), max_n=st.integers(1, 4), min_sub=st.integers(0, 3))
def test_lookup_matches_the_reference(rows, k, max_n, min_sub):
  min_n = max(1, max_n - min_sub)
  got = _lookup(rows, k, max_n, min_n, capacity=32)
  want = [_reference(r, k, max_n, min_n) for r in rows]
  assert got.tolist() == want


VOCAB = 61


@pytest.mark.parametrize("batch,k", [(1, 1), (3, 3), (4, 6)])
def test_strict_and_asd_budget0_equal_plain_greedy(batch, k):
  from asd_jax.asd_config import ASDConfig
  fns, params = decoder_fns(random_decoder(seed=k, vocab=VOCAB, num_layers=2))
  # A small alphabet in the prompt gives the lookup matches to propose (and to get wrong).
  prompt, lengths = random_prompts(np.random.RandomState(k), batch, 16, 5)
  want = plain_decode(fns, params, prompt, lengths, max_new_tokens=40).tokens_BxN
  drafter = ngram_drafter(k, VOCAB)
  for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(0.0, 0.25, 2))):
    got = asd_decode(fns, params, drafter, None, prompt, lengths, max_new_tokens=40,
                     rule=rule, asd_config=cfg)
    assert_equal_up_to_near_ties(params, prompt, lengths, got.tokens_BxN, want)
    assert int(np.asarray(got.stats.accepted_B).sum()) > 0  # accepted blocks were exercised


def test_a_repeating_output_is_drafted_block_after_block():
  # The fake target counts modulo 8; once the prompt holds one cycle every draft is right.
  fns = fake_lm(vocab_size=8)
  prompt = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 0]], np.int32)
  k = 4
  out = asd_decode(fns, None, ngram_drafter(k, 8), None, prompt, np.array([9], np.int32),
                   max_new_tokens=41)
  assert np.asarray(out.tokens_BxN)[0].tolist() == [(1 + i) % 8 for i in range(41)]
  rounds, accepted = int(out.stats.rounds_B[0]), int(out.stats.accepted_B[0])
  assert rounds == 8 and accepted == k * rounds  # 1 prefill token + 8 rounds of K + 1


def _nan_when_verifying(fns):
  """The fake target, but any forward over more than one token returns NaN logits."""
  def forward(params, tokens_BxT, positions_BxT, cache):
    logits, hidden, cache = fns.forward(params, tokens_BxT, positions_BxT, cache)
    return (logits * jnp.nan if tokens_BxT.shape[1] > 1 else logits), hidden, cache
  return dataclasses.replace(fns, forward=forward)


@pytest.mark.parametrize("rule", ["strict", "sample"])
def test_rounds_without_a_match_run_as_one_token_steps(rule):
  fns = _nan_when_verifying(fake_lm(vocab_size=64))
  drafter = ngram_drafter(3, 64)
  # rule='sample' at top_k=1 samples the fake target's one likely token, like greedy.
  sampling = SamplingConfig(temperature=1.0, top_k=1) if rule == "sample" else SamplingConfig()
  run = functools.partial(asd_decode, fns, None, drafter, None, max_new_tokens=20, rule=rule,
                          sampling=sampling)
  # Counting up from distinct tokens: no bigram ever repeats, so no round verifies.
  out = run(np.array([[0, 1, 2, 3, 4]], np.int32), np.array([5], np.int32))
  assert not bool(out.nonfinite_B[0])
  assert np.asarray(out.tokens_BxN)[0].tolist() == list(range(5, 25))
  assert int(out.stats.rounds_B[0]) == 19 and int(out.stats.accepted_B[0]) == 0
  # Control: with a repeated bigram in the prompt the engine does verify, and trips the NaN.
  out = run(np.array([[5, 6, 0, 1, 2, 3, 4]], np.int32), np.array([7], np.int32))
  assert bool(out.nonfinite_B[0])


# min_ngram=1 matches nearly always; 2 seldom on the default prompt, but every first round on
# one that repeats its last bigram (3, 7 -> drafts 3, 7).
NGRAM_CASES = [(1, sampling_check.PROMPT), (2, sampling_check.PROMPT), (2, [3, 7, 3, 7])]


@pytest.mark.parametrize("min_ngram, prompt", NGRAM_CASES)
def test_lossless_sampling(min_ngram, prompt):
  """rule='sample' with the one-hot n-gram proposal keeps the target's distribution, whether
  drafts match often or seldom."""
  target = random_decoder(seed=11, vocab=sampling_check.V, num_layers=2, hidden=32)
  tfns, tparams = decoder_fns(target)
  sampling = SamplingConfig(temperature=1.0)
  exact = sampling_check._exact_joint(tfns, tparams, sampling, prompt)
  drafter = ngram_drafter(2, sampling_check.V, min_ngram=min_ngram)
  got = sampling_check._sampled_joint(tfns, tparams, drafter, None, sampling, seed0=1,
                                      prompt=prompt)
  tv = sampling_check._tv
  assert tv(got.sum(axis=2), exact.sum(axis=2)) <= sampling_check.TV_LIMIT
  assert tv(got.sum(axis=0), exact.sum(axis=0)) <= sampling_check.TV_LIMIT


@pytest.mark.parametrize("min_ngram, prompt", [NGRAM_CASES[0], NGRAM_CASES[2]])
def test_the_lossless_check_can_fail_with_ngram_drafts(monkeypatch, min_ngram, prompt):
  """The same check with a sampler that accepts every n-gram draft fails the bound, for drafts
  from 1-grams and from a repeated bigram (the seldom-matching case cannot show this)."""
  target = random_decoder(seed=11, vocab=sampling_check.V, num_layers=2, hidden=32)
  tfns, tparams = decoder_fns(target)
  sampling = SamplingConfig(temperature=1.0)
  exact = sampling_check._exact_joint(tfns, tparams, sampling, prompt)
  drafter = sampling_check.trust_every_draft(
      monkeypatch, ngram_drafter(2, sampling_check.V, min_ngram=min_ngram))
  got = sampling_check._sampled_joint(tfns, tparams, drafter, None, sampling, seed0=5, calls=2,
                                      prompt=prompt)
  tv = sampling_check._tv
  assert max(tv(got.sum(axis=0), exact.sum(axis=0)),
             tv(got.sum(axis=2), exact.sum(axis=2))) > sampling_check.TV_LIMIT


def test_a_sampled_row_does_not_depend_on_its_batch():
  """With per-row seeds a sampled row equals the same request decoded alone. The n-gram
  drafter's lengths differ between rows, so a batch-wide verify width (or a plain step when no
  row matched) would spend a row's key differently depending on the other rows: in this case
  row 1 sampled [.., 33, 18, 34, ..] in the batch and [.., 8, 7, 21, ..] alone before sampling
  verified all K every round."""
  vocab = 61
  tfns, tparams = decoder_fns(random_decoder(seed=0, vocab=vocab, num_layers=2, hidden=32))
  drafter = ngram_drafter(3, vocab, max_ngram=3, min_ngram=1)
  sampling = SamplingConfig(temperature=0.9, top_k=20)
  rng = np.random.RandomState(3)
  lengths = np.array([2, 15, 5], np.int32)
  prompt = np.zeros((3, 15), np.int32)
  for i, n in enumerate(lengths):
    prompt[i, :n] = rng.randint(0, vocab, size=n)
  seeds = np.array([11, 22, 33])

  def run(rows):
    return np.asarray(asd_decode(tfns, tparams, drafter, None, prompt[rows], lengths[rows],
                                 max_new_tokens=10, rule="sample", sampling=sampling,
                                 seed=seeds[rows]).tokens_BxN)

  batch = run([0, 1, 2])
  for row in range(3):
    np.testing.assert_array_equal(run([row])[0], batch[row], err_msg=f"row {row}")


def test_names_and_bad_settings():
  assert parse_ngram_name("ngram") == (2, 3)
  assert parse_ngram_name("ngram:5") == (2, 5)
  assert parse_ngram_name("ngram:1") == (1, 1)
  assert parse_ngram_name("ngram:1-4") == (1, 4)
  assert parse_ngram_name("smollm2-135m-eagle3") is None
  for bad in ("ngram:x", "ngram:0", "ngram:3-2"):
    with pytest.raises(ValueError, match="n-gram drafter name"):
      parse_ngram_name(bad)
  with pytest.raises(ValueError, match="K"):
    ngram_drafter(0, 10)
  with pytest.raises(ValueError, match="min_ngram"):
    ngram_drafter(2, 10, min_ngram=3, max_ngram=2)


def test_setup_refuses_trees_and_keeps_the_target_vocabulary():
  from asd_jax.draft_tree import TreeShape
  from models.drafter_setup import infer_kind, setup_drafter
  from models.load import LoadedModel
  model = random_decoder(seed=0, vocab=VOCAB, num_layers=1)
  loaded = LoadedModel(cfg=model.cfg, model=model, hf_config={}, source="test")
  assert infer_kind("ngram:2-4") == "ngram"
  setup = setup_drafter("ngram:2-4", loaded, k=3)
  assert setup.engine == "chain" and setup.drafter.vocab_size == VOCAB
  with pytest.raises(ValueError, match="chains only"):
    setup_drafter("ngram", loaded, k=3, tree=TreeShape(3, 2, 6))
