"""Invariants of the decoder and the plain decode loop on tiny random models."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from models.kv_cache import KVCache
from models.lm_fns import decoder_fns
from tests.fake_lm import fake_lm
from tests.tiny_models import random_decoder, random_prompts

VOCAB = 97
_MODEL = random_decoder(seed=0, vocab=VOCAB)
_FNS, _PARAMS = decoder_fns(_MODEL)
_FORWARD = jax.jit(_FNS.forward)
CAPACITY = 48


def _full_logits(ids_BxT):
  b, t = ids_BxT.shape
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  return np.asarray(_FORWARD(_PARAMS, jnp.asarray(ids_BxT), pos,
                             _FNS.init_cache(b, CAPACITY))[0])


@settings(max_examples=12, deadline=None)
@given(batch=st.integers(1, 3), total=st.integers(2, 24), data=st.data())
def test_cached_decoding_equals_full_forward(batch, total, data):
  ids = np.random.RandomState(total).randint(0, VOCAB, size=(batch, total))
  # Split the sequence into random chunks: prefill, then multi-token and single-token steps.
  cuts = sorted(set(data.draw(st.lists(st.integers(1, total - 1), max_size=4))))
  bounds = [0, *cuts, total]
  cache = _FNS.init_cache(batch, CAPACITY)
  pieces = []
  for lo, hi in zip(bounds[:-1], bounds[1:]):
    pos = jnp.broadcast_to(jnp.arange(lo, hi), (batch, hi - lo))
    logits, _, cache = _FORWARD(_PARAMS, jnp.asarray(ids[:, lo:hi]), pos, cache)
    pieces.append(np.asarray(logits))
  np.testing.assert_allclose(np.concatenate(pieces, axis=1), _full_logits(ids), atol=2e-5)


@settings(max_examples=10, deadline=None)
@given(t=st.integers(1, 18), seed=st.integers(0, 1000))
def test_causality(t, seed):
  rng = np.random.RandomState(seed)
  ids = rng.randint(0, VOCAB, size=(1, 20))
  changed = ids.copy()
  changed[0, t:] = rng.randint(0, VOCAB, size=20 - t)
  a, b = _full_logits(ids), _full_logits(changed)
  np.testing.assert_array_equal(a[:, :t], b[:, :t])


def test_rows_are_independent_of_their_batch():
  prompt, lengths = random_prompts(np.random.RandomState(5), batch=5, max_len=12, vocab=VOCAB)
  together = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=16)
  for b in range(5):
    alone = plain_decode(_FNS, _PARAMS, prompt[b:b + 1], lengths[b:b + 1], max_new_tokens=16)
    np.testing.assert_array_equal(alone.tokens_BxN[0], together.tokens_BxN[b])


def test_right_padding_content_is_ignored():
  prompt, lengths = random_prompts(np.random.RandomState(6), batch=3, max_len=10, vocab=VOCAB)
  noisy = prompt.copy()
  pad = np.arange(10)[None] >= lengths[:, None]
  noisy[pad] = 7
  a = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=8)
  b = plain_decode(_FNS, _PARAMS, noisy, lengths, max_new_tokens=8)
  np.testing.assert_array_equal(a.tokens_BxN, b.tokens_BxN)


def test_eos_and_per_row_limits_with_fake_model():
  fns = fake_lm(vocab_size=32)
  prompt = np.array([[3, 0], [20, 21]], np.int32)
  lengths = np.array([1, 2], np.int32)
  out = plain_decode(fns, None, prompt, lengths, max_new_tokens=10, eos_ids=(8,),
                     max_new_B=np.array([10, 4]))
  # Row 0 counts 4, 5, 6, 7, 8 and stops at EOS 8 (kept); row 1 stops after 4 tokens.
  assert out.tokens_BxN[0].tolist() == [4, 5, 6, 7, 8] + [-1] * 5
  assert out.tokens_BxN[1].tolist() == [22, 23, 24, 25] + [-1] * 6
  assert out.num_generated_B.tolist() == [5, 4]
  assert not out.nonfinite_B.any()


def test_nonfinite_logits_stop_the_row_without_emitting():
  fns = fake_lm(vocab_size=32, nan_after_position=4)
  prompt = np.array([[1, 2, 0], [1, 0, 0]], np.int32)
  out = plain_decode(fns, None, prompt, np.array([2, 1], np.int32), max_new_tokens=6)
  # Row 0: prefill logits at position 1 are finite -> 3; positions 2, 3 -> 4, 5; position 4 NaN.
  assert out.tokens_BxN[0].tolist() == [3, 4, 5, -1, -1, -1]
  assert out.tokens_BxN[1].tolist() == [2, 3, 4, 5, -1, -1]
  assert out.nonfinite_B.tolist() == [True, True]


def test_sampling_is_reproducible_and_seed_dependent():
  prompt, lengths = random_prompts(np.random.RandomState(7), batch=2, max_len=6, vocab=VOCAB)
  cfg = SamplingConfig(temperature=1.0, top_k=20, top_p=0.9)
  a = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12, sampling=cfg, seed=1)
  b = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12, sampling=cfg, seed=1)
  c = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=12, sampling=cfg, seed=2)
  np.testing.assert_array_equal(a.tokens_BxN, b.tokens_BxN)
  assert not np.array_equal(a.tokens_BxN, c.tokens_BxN)


def test_kv_writes_past_capacity_are_dropped_not_clamped():
  cache = KVCache.create(_MODEL.cfg, 1, 8)
  ids = jnp.arange(4)[None]
  _, _, cache = _FORWARD(_PARAMS, ids, jnp.arange(4)[None], cache)
  before = np.asarray(cache.k[0])
  _, _, after = _FORWARD(_PARAMS, ids[:, :1], jnp.array([[8]]), cache)
  np.testing.assert_array_equal(np.asarray(after.k[0]), before)


@pytest.mark.parametrize("prompt,lengths,kwargs,match", [
    (np.zeros((1, 4), np.int32), np.array([0]), {}, "empty prompt"),
    (np.array([[1, 2, VOCAB]]), np.array([3]), {}, "outside the vocabulary"),
    (np.array([[1, -1]]), np.array([2]), {}, "outside the vocabulary"),
    (np.array([[1.0, 2.0]]), np.array([2]), {}, "integers"),
    (np.array([[1, 2]]), np.array([2]), {"max_new_tokens": 0}, "max_new_tokens"),
    (np.array([[1, 2]]), np.array([2]), {"capacity": 8, "max_new_tokens": 7}, "cache slots"),
    (np.array([[1, 2]]), np.array([2]), {"eos_ids": (VOCAB + 3,)}, "eos id"),
])
def test_bad_requests_are_refused_before_running(prompt, lengths, kwargs, match):
  kwargs = {"max_new_tokens": 4, **kwargs}
  with pytest.raises((ValueError, TypeError), match=match):
    plain_decode(_FNS, _PARAMS, prompt, lengths, **kwargs)


def test_requests_stop_at_the_models_context_window():
  """The decoder's fns carry its config's window; prompt + max_new_tokens may fill it exactly
  (the longest row counts, not the padded width) and not one position more."""
  assert _FNS.max_positions == _MODEL.cfg.max_position_embeddings
  window = _MODEL.cfg.max_position_embeddings
  prompt = np.zeros((2, 8), np.int32)
  prompt[:, :5] = 7
  lengths = np.array([5, 3], np.int32)
  out = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=window - 5)
  assert int(np.max(out.num_generated_B)) == window - 5
  with pytest.raises(ValueError, match=f"= {window + 1} exceeds the context window"):
    plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=window - 4)


@pytest.mark.parametrize("kwargs,match", [
    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"), ({"top_k": -2}, "top_k")])
def test_bad_sampling_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(**kwargs)
