"""prompt_logprobs: each prompt token's log p given the tokens before it, equal to one causal
forward over the row alone, whatever the chunk and the batch; the top L at each position;
decoding's output logprobs agree with scoring prompt + output; bad input refused."""

import dataclasses
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.plain_decode import plain_decode
from asd_jax.prompt_logprobs import CHUNK, prompt_logprobs
from models.lm_fns import decoder_fns
from tests.fake_lm import fake_lm
from tests.tiny_models import random_decoder

VOCAB = 61
_FNS, _PARAMS = decoder_fns(random_decoder(seed=3, vocab=VOCAB, num_layers=2))
# Rows of lengths 37, 1 (nothing to score) and 20 in a 40-wide batch.
_LENGTHS = np.array([37, 1, 20], np.int32)
_PROMPT = np.where(np.arange(40)[None] < _LENGTHS[:, None],
                   np.random.RandomState(0).randint(0, VOCAB, (3, 40)), 0).astype(np.int32)


def _log_softmax_alone(row) -> np.ndarray:
  """float32[T, V]: log p(. | row[:t + 1]) at each position t, from one forward over the row
  alone in a cache of exactly its length."""
  n = len(row)
  logits, _, _ = _FNS.forward(_PARAMS, jnp.asarray([row], jnp.int32),
                              jnp.arange(n, dtype=jnp.int32)[None], _FNS.init_cache(1, n))
  return np.asarray(jax.nn.log_softmax(logits[0], axis=-1))


@pytest.mark.parametrize("chunk", [CHUNK, 16, 7])
def test_each_token_is_scored_as_one_forward_over_its_row_alone(chunk):
  top = 4
  got = jax.device_get(prompt_logprobs(_FNS, _PARAMS, _PROMPT, _LENGTHS, top_logprobs=top,
                                       chunk=chunk))
  assert got.logprobs_BxT.shape == (3, 40) and got.top_token_ids_BxTxL.shape == (3, 40, top)
  assert not got.nonfinite_B.any()
  for b, n in enumerate(_LENGTHS):
    row = _PROMPT[b, :n]
    # Nothing precedes token 0, and nothing is scored past the row: log p 0, top ids -1.
    for t in [0, *range(n, 40)]:
      assert got.logprobs_BxT[b, t] == 0 and (got.top_token_ids_BxTxL[b, t] == -1).all()
    if n == 1:
      continue
    want = _log_softmax_alone(row)[:-1]  # position t predicts token t + 1
    np.testing.assert_allclose(got.logprobs_BxT[b, 1:n], want[np.arange(n - 1), row[1:]],
                               atol=2e-5)
    want_ids = np.argsort(-want, axis=-1, kind="stable")[:, :top]
    np.testing.assert_array_equal(got.top_token_ids_BxTxL[b, 1:n], want_ids)
    np.testing.assert_allclose(got.top_logprobs_BxTxL[b, 1:n],
                               np.take_along_axis(want, want_ids, axis=-1), atol=2e-5)


def test_without_top_logprobs_only_the_tokens_own_are_returned():
  got = prompt_logprobs(_FNS, _PARAMS, _PROMPT, _LENGTHS)
  with_top = prompt_logprobs(_FNS, _PARAMS, _PROMPT, _LENGTHS, top_logprobs=2)
  assert got.top_token_ids_BxTxL is None and got.top_logprobs_BxTxL is None
  np.testing.assert_array_equal(got.logprobs_BxT, with_top.logprobs_BxT)


def test_output_logprobs_equal_scoring_the_prompt_with_its_answer():
  """Decoding's per-token logprobs (from its prefill and decode steps) and scoring prompt +
  answer as one prompt are two computations of the same numbers."""
  lengths = np.array([9, 5], np.int32)
  prompt = _PROMPT[[0, 2], :9] * (np.arange(9)[None] < lengths[:, None])
  out = jax.device_get(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12,
                                    logprobs=True))
  for b, n in enumerate(lengths):
    answer = out.tokens_BxN[b, :out.num_generated_B[b]]
    assert len(answer) == 12  # the premise: no EOS given, every row runs its length
    whole = np.concatenate([prompt[b, :n], answer])[None]
    scored = jax.device_get(prompt_logprobs(_FNS, _PARAMS, whole, [whole.shape[1]], chunk=8))
    np.testing.assert_allclose(scored.logprobs_BxT[0, n:], out.logprobs_BxN[b, :12], atol=1e-4)


def test_exact_values_from_a_fake_model():
  """fake_lm puts logit 10 on (token + 1) mod V and 0 elsewhere: a token that follows its
  predecessor by one has log p = 10 - log(e^10 + V - 1), any other -log(e^10 + V - 1)."""
  v = 32
  fns = fake_lm(v)
  row = [3, 4, 5, 9, 10, 0]
  got = jax.device_get(prompt_logprobs(fns, None, [row], [len(row)], top_logprobs=1))
  norm = math.log(math.exp(10) + v - 1)
  want = [0, 10 - norm, 10 - norm, -norm, 10 - norm, -norm]
  np.testing.assert_allclose(got.logprobs_BxT[0], want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(got.top_token_ids_BxTxL[0, 1:, 0], np.array(row[:-1]) + 1)


def test_nonfinite_logits_mark_their_row_and_stay_nan():
  """Logits of positions >= 4 are NaN: the row that reaches them is marked and its entries
  from there are NaN (nothing clamped); the shorter row is untouched."""
  fns = fake_lm(32, nan_after_position=4)
  prompt = np.array([[1, 2, 3, 4, 5, 6, 7], [1, 2, 3, 4, 0, 0, 0]], np.int32)
  got = jax.device_get(prompt_logprobs(fns, None, prompt, [7, 4]))
  assert got.nonfinite_B.tolist() == [True, False]
  assert np.isfinite(got.logprobs_BxT[0, :5]).all() and np.isnan(got.logprobs_BxT[0, 5:]).all()
  assert np.isfinite(got.logprobs_BxT[1]).all()


def test_the_program_is_reused_for_another_prompt_of_the_same_width():
  # (asd_jax's own `prompt_logprobs` attribute is the function it exports, not the module)
  module = importlib.import_module("asd_jax.prompt_logprobs")
  prompt_logprobs(_FNS, _PARAMS, _PROMPT, _LENGTHS)
  before = module._score_prompts._cache_size()
  prompt_logprobs(_FNS, _PARAMS, (_PROMPT + 1) % VOCAB, np.array([2, 40, 11], np.int32))
  assert module._score_prompts._cache_size() == before


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(lengths_B=[0, 1, 1]), ValueError, "empty prompt in row 0"),
    (dict(prompt_BxT=np.full((3, 40), VOCAB)), ValueError, "outside the vocabulary [0, 61)"),
    (dict(top_logprobs=-1), ValueError, "top_logprobs must be >= 0"),
    (dict(top_logprobs=VOCAB + 1), ValueError, "more than the vocabulary's 61 tokens"),
    (dict(top_logprobs=True), TypeError, "top_logprobs must be int"),
    (dict(chunk=0), ValueError, "chunk must be a positive integer"),
    (dict(params={"w": np.zeros(3)}), ValueError, "are they another model's parameters?"),
    (dict(fns=object()), TypeError, "fns must be"),
])
def test_bad_input_is_refused(kwargs, error, message):
  call = {**dict(fns=_FNS, params=_PARAMS, prompt_BxT=_PROMPT, lengths_B=_LENGTHS), **kwargs}
  with pytest.raises(error) as e:
    prompt_logprobs(**call)
  assert message in str(e.value)


def test_a_prompt_past_the_context_window_is_refused():
  fns = dataclasses.replace(fake_lm(32), max_positions=6)
  prompt_logprobs(fns, None, [[1, 2, 3, 4, 5, 6]], [6])  # the window exactly
  with pytest.raises(ValueError, match=r"prompt \(7 tokens\) exceeds the context window of "
                                       r"'fake' \(6 positions\)"):
    prompt_logprobs(fns, None, [[1, 2, 3, 4, 5, 6, 7]], [7])
