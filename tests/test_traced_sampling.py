"""Sampling settings are traced in the decode loops: a request at another temperature, top-k,
top-p, min-p, penalty, min_tokens or logit bias reuses the compiled program (a server would
otherwise compile the whole loop, model included, for every new setting); only which filters are
on, and whether any penalty, min_tokens or bias is, changes the program."""

import jax
import numpy as np
import pytest

from asd_jax import SamplingConfig, TreeShape, asd_decode, asd_tree_decode, lm_chain_drafter
from asd_jax import lm_tree_drafter, plain_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=1)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.2, seed=3))
_CHAIN = lm_chain_drafter(_FNS, 3)
_TREE = lm_tree_drafter(_FNS, TreeShape(2, 2, 4))
_PROMPT, _LENGTHS = random_prompts(np.random.RandomState(0), 2, 6, VOCAB)


class _Compilations:
  """XLA backend compilations of any function (jax.monitoring), counted from registration."""

  def __init__(self):
    self.count = 0
    jax.monitoring.register_event_duration_secs_listener(self._on_event)

  def _on_event(self, event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration":
      self.count += 1


_COMPILATIONS = _Compilations()

_ENGINES = {
    "plain": lambda s, **kw: plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=12,
                                          sampling=s, seed=7, **kw),
    "chain": lambda s, **kw: asd_decode(_FNS, _PARAMS, _CHAIN, _DRAFT_PARAMS, _PROMPT, _LENGTHS,
                                        max_new_tokens=12, rule="sample", sampling=s, seed=7,
                                        **kw),
    "tree": lambda s, **kw: asd_tree_decode(_FNS, _PARAMS, _TREE, _DRAFT_PARAMS, _PROMPT,
                                            _LENGTHS, max_new_tokens=12, rule="sample",
                                            sampling=s, seed=7, **kw),
}


@pytest.mark.parametrize("engine", sorted(_ENGINES))
def test_other_sampling_values_reuse_the_compiled_loop(engine):
  decode = _ENGINES[engine]
  first = np.asarray(decode(SamplingConfig(0.7, top_k=5, top_p=0.9, min_p=0.05)).tokens_BxN)
  before = _COMPILATIONS.count
  others = [np.asarray(decode(SamplingConfig(t, top_k=k, top_p=p, min_p=m)).tokens_BxN)
            for t, k, p, m in ((1.3, 9, 0.8, 0.01), (0.05, 60, 0.99, 0.2), (2.0, 1, 0.5, 0.5))]
  again = np.asarray(decode(SamplingConfig(0.7, top_k=5, top_p=0.9, min_p=0.05)).tokens_BxN)
  assert _COMPILATIONS.count == before
  # The values reach the program: other settings sample otherwise, the first ones the same.
  np.testing.assert_array_equal(again, first)
  assert any(not np.array_equal(o, first) for o in others)
  # top_k=1 keeps only the argmax: sampling at any temperature is then greedy decoding.
  greedy = np.asarray(plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS,
                                   max_new_tokens=12).tokens_BxN)
  np.testing.assert_array_equal(others[2], greedy)
  # Control: switching a filter off is another program, and the counter sees it.
  before = _COMPILATIONS.count
  decode(SamplingConfig(0.7, top_k=5))
  assert _COMPILATIONS.count > before


@pytest.mark.parametrize("engine", sorted(_ENGINES))
def test_other_penalty_values_reuse_the_compiled_loop(engine):
  decode = _ENGINES[engine]

  def run(repetition, presence, frequency):
    return np.asarray(decode(SamplingConfig(0.7, repetition_penalty=repetition,
                                            presence_penalty=presence,
                                            frequency_penalty=frequency)).tokens_BxN)

  first = run(1.2, 0.5, 0.1)
  before = _COMPILATIONS.count
  others = [run(*values) for values in ((0.5, -2.0, 0.0), (1.0, 0.0, 2.0), (3.0, 1.5, -1.0))]
  again = run(1.2, 0.5, 0.1)
  assert _COMPILATIONS.count == before
  np.testing.assert_array_equal(again, first)
  assert any(not np.array_equal(o, first) for o in others)
  # (1, 0, 0) inside the penalized program samples as the program without penalties.
  off = np.asarray(decode(SamplingConfig(0.7)).tokens_BxN)
  assert _COMPILATIONS.count > before  # the control: penalties off is its own program
  np.testing.assert_array_equal(run(1.0, 0.0, 1e-30), off)


@pytest.mark.parametrize("engine", sorted(_ENGINES))
def test_other_min_tokens_logit_bias_and_allowed_values_reuse_the_compiled_loop(engine):
  decode = _ENGINES[engine]
  eos = (3, 8)

  def run(min_tokens, bias, allowed):
    out = decode(SamplingConfig(0.7, min_tokens=min_tokens, logit_bias=bias,
                                allowed_token_ids=allowed), eos_ids=eos)
    return np.asarray(out.tokens_BxN)

  first = run(4, {1: 2.0, 5: -3.0}, range(40))
  before = _COMPILATIONS.count
  others = [run(*values) for values in ((2, {7: 5.0}, range(20, 61)),
                                        (12, {1: -100.0, 2: 100.0}, range(61)),
                                        (1, {1: 1.0}, [9, 10]))]
  again = run(4, {1: 2.0, 5: -3.0}, range(40))
  assert _COMPILATIONS.count == before
  np.testing.assert_array_equal(again, first)
  # The values reach the program: a +100 bias makes token 2 every token; the allowed ids hold.
  assert (others[1] == 2).all() and not np.array_equal(others[0], first)
  assert np.isin(others[2], [9, 10]).all() and (others[0] >= 20).all()
  decode(SamplingConfig(0.7, logit_bias={1: 2.0}), eos_ids=eos)  # min_tokens off
  assert _COMPILATIONS.count > before  # the control: another program
