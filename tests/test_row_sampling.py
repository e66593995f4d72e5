"""sampling=[one SamplingConfig per row]: a batch of requests that sample differently (a
server's batch) decodes each row as that row decodes alone with its own settings and seed, in
plain decoding and under every speculative rule; the per-row filters and logit edits equal
each row's own, exactly; bad lists are refused."""

import dataclasses

import jax
import numpy as np
import pytest

from asd_jax import logit_edits
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import RowSampling, SamplingConfig, sampling_for_rows
from asd_jax.spec_decode import asd_decode
from asd_jax.spec_sampling import Filters, filtered_probs
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder

VOCAB = 61
EOS = (2,)
_FNS, _PARAMS = decoder_fns(random_decoder(seed=7, vocab=VOCAB, num_layers=2))
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(random_decoder(seed=7, vocab=VOCAB, num_layers=2),
                                              0.3, seed=4))
_CHAIN = lm_chain_drafter(_FNS, 3)
_TREE = lm_tree_drafter(_FNS, TreeShape(depth=3, top_k=2, num_nodes=6))

# One request each: greedy with a penalty; top-k; top-p with min-p and a presence penalty;
# a bias with min_tokens; allowed ids (EOS among them); plain temperature.
SAMPLED_ROWS = [
    SamplingConfig(repetition_penalty=1.3),
    SamplingConfig(temperature=0.8, top_k=5),
    SamplingConfig(temperature=1.2, top_p=0.9, min_p=0.05, presence_penalty=0.5),
    SamplingConfig(temperature=1.0, logit_bias={3: 2.0, 2: 1.5}, min_tokens=6),
    SamplingConfig(temperature=0.7, allowed_token_ids=list(range(0, VOCAB, 2))),
    SamplingConfig(temperature=1.0),
]
# Every row greedy, each with its own edits (the greedy rules take these).
GREEDY_ROWS = [
    SamplingConfig(),
    SamplingConfig(frequency_penalty=0.8),
    SamplingConfig(logit_bias={2: 3.0}, min_tokens=9),
    SamplingConfig(allowed_token_ids=[2, 5, 7, 11, 13, 40]),
]
_PROMPTS = [[5, 9, 3, 17, 4], [8, 8, 1], [30, 31, 32, 33, 34, 35, 36], [12], [44, 2, 6, 9],
            [20, 21]]
SEEDS = np.array([11, 12, 13, 14, 15, 16])


def _batch(rows):
  prompts = _PROMPTS[:len(rows)]
  width = max(map(len, prompts))
  prompt = np.array([p + [0] * (width - len(p)) for p in prompts], np.int32)
  return prompt, np.array([len(p) for p in prompts], np.int32)


def _engine(name, rule):
  if name == "plain":
    return lambda **kw: plain_decode(_FNS, _PARAMS, **kw)
  if name == "chain":
    return lambda **kw: asd_decode(_FNS, _PARAMS, _CHAIN, _DRAFT_PARAMS, rule=rule, **kw)
  if name == "ngram":
    return lambda **kw: asd_decode(_FNS, _PARAMS, ngram_drafter(3, VOCAB), None, rule=rule,
                                   **kw)
  return lambda **kw: asd_tree_decode(_FNS, _PARAMS, _TREE, _DRAFT_PARAMS, rule=rule, **kw)


def _answers(result):
  result = jax.device_get(result)
  return [result.tokens_BxN[b, :result.num_generated_B[b]].tolist()
          for b in range(result.tokens_BxN.shape[0])]


@pytest.mark.parametrize("engine,rule,rows", [
    ("plain", None, SAMPLED_ROWS), ("chain", "sample", SAMPLED_ROWS),
    ("tree", "sample", SAMPLED_ROWS), ("ngram", "sample", SAMPLED_ROWS),
    ("plain", None, GREEDY_ROWS), ("chain", "strict", GREEDY_ROWS),
    ("tree", "strict", GREEDY_ROWS), ("chain", "asd", GREEDY_ROWS)])
def test_each_row_decodes_as_it_does_alone(engine, rule, rows):
  decode = _engine(engine, rule)
  prompt, lengths = _batch(rows)
  together = _answers(decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=14,
                             eos_ids=EOS, sampling=list(rows), seed=SEEDS[:len(rows)]))
  for b, own in enumerate(rows):
    alone = _answers(decode(prompt_BxT=prompt[b:b + 1, :lengths[b]], lengths_B=lengths[b:b + 1],
                            max_new_tokens=14, eos_ids=EOS, sampling=own, seed=SEEDS[b:b + 1]))
    assert together[b] == alone[0], (b, own)
  # The premise: the rows' settings matter here (the batch under the first row's settings
  # alone answers otherwise).
  first_only = _answers(decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=14,
                               eos_ids=EOS, sampling=rows[0], seed=SEEDS[:len(rows)]))
  assert first_only != together
  # Row 3 of the sampled rows holds EOS back for 6 tokens; row 4 keeps to its allowed ids.
  if rows is SAMPLED_ROWS:
    assert len(together[3]) >= 6 and all(t % 2 == 0 for t in together[4])


def test_per_row_filters_equal_each_rows_own_exactly():
  """The per-row filter (and edit) of a batch, row by row, is bit-for-bit what the row's own
  settings give: rows that do not use a filter the batch runs keep their values."""
  configs = SAMPLED_ROWS + [SamplingConfig(temperature=0.5, top_p=0.8)]
  z = np.random.RandomState(0).randn(len(configs), 4, VOCAB).astype(np.float32) * 3
  filters = RowSampling(tuple(configs)).filters()
  assert filters.some_greedy and filters.use_top_k and filters.use_top_p and filters.use_min_p
  for logits in (z, z[:, 0]):
    together = np.asarray(jax.jit(filtered_probs)(logits, filters))
    for b, own in enumerate(configs):
      alone = np.asarray(jax.jit(filtered_probs)(logits[b:b + 1], own.filters()))[0]
      np.testing.assert_array_equal(together[b], alone)
  edits = RowSampling(tuple(configs)).logit_edits(VOCAB, EOS, 14)
  counts = logit_edits.count_prompt(np.zeros((len(configs), 3), np.int32),
                                    np.full(len(configs), 3), VOCAB, edits)
  together = np.asarray(logit_edits.edit_logits(z[:, 0], counts, edits))
  for b, own in enumerate(configs):
    own_edits = own.logit_edits(VOCAB, EOS, 14)
    own_counts = logit_edits.count_prompt(np.zeros((1, 3), np.int32), np.full(1, 3), VOCAB,
                                          own_edits)
    np.testing.assert_array_equal(
        together[b], np.asarray(logit_edits.edit_logits(z[b:b + 1, 0], own_counts,
                                                         own_edits))[0].astype(np.float32))


def test_a_list_of_equal_settings_is_one_setting():
  same = [SamplingConfig(temperature=0.5)] * 3
  assert sampling_for_rows(same, 3) == SamplingConfig(temperature=0.5)
  assert isinstance(sampling_for_rows(SAMPLED_ROWS[:2], 2), RowSampling)
  assert Filters.of_rows([Filters.of(0.0)] * 2).greedy


@pytest.mark.parametrize("engine,rule,sampling,error,message", [
    ("plain", None, SAMPLED_ROWS[:2], ValueError,
     "sampling has 2 SamplingConfigs for 6 prompt rows"),
    ("chain", "sample", SAMPLED_ROWS[:5], ValueError,
     "sampling has 5 SamplingConfigs for 6 prompt rows"),
    ("plain", None, [], ValueError, "sampling is an empty list"),
    ("plain", None, [SamplingConfig()] * 5 + [0.5], TypeError,
     "sampling[5] must be a SamplingConfig, got float"),
    ("plain", None, {"temperature": 1.0}, TypeError, "sampling must be a SamplingConfig"),
    ("chain", "strict", SAMPLED_ROWS, ValueError,
     "rule 'strict' is greedy (temperature 0); use rule='sample' for temperature 0.8"),
    ("tree", "asd", SAMPLED_ROWS, ValueError, "rule 'asd' is greedy"),
])
def test_bad_lists_are_refused(engine, rule, sampling, error, message):
  prompt, lengths = _batch(SAMPLED_ROWS)
  with pytest.raises(error) as e:
    _engine(engine, rule)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=4,
                          sampling=sampling)
  assert message in str(e.value)


def test_other_per_row_values_reuse_the_compiled_loop():
  """Per-row values are traced like one request's: a batch at other temperatures, filters and
  edits (the same ones on) runs the program already compiled."""
  from asd_jax.plain_decode import _plain_decode as loop
  prompt, lengths = _batch(SAMPLED_ROWS)
  plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6, sampling=SAMPLED_ROWS)
  before = loop._cache_size()
  other = [SamplingConfig(repetition_penalty=1.1), SamplingConfig(temperature=0.3, top_k=9),
           SamplingConfig(temperature=0.9, top_p=0.5, min_p=0.2, presence_penalty=-1.0),
           SamplingConfig(temperature=2.0, logit_bias={7: -4.0}, min_tokens=2),
           SamplingConfig(temperature=0.2, allowed_token_ids=[1, 2, 3]),
           SamplingConfig(temperature=0.4)]
  plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6, sampling=other)
  assert loop._cache_size() == before
  # The control: a batch with no greedy row is another program (which rows are greedy is
  # static).
  plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6,
               sampling=[dataclasses.replace(s, temperature=0.5) for s in other])
  assert loop._cache_size() > before


@pytest.mark.parametrize("engine,rule", [("plain", None), ("chain", "strict")])
def test_each_row_waits_for_its_own_min_tokens_before_a_stop_string(engine, rule):
  """Stop strings count from each row's own min_tokens on: one prompt three times, at
  min_tokens 0, first + 1 and first + 2 (first: where a letter the greedy answer holds twice
  first shows; each token shows as one letter), in one call."""
  from asd_jax.stop_strings import StopStrings

  def letters(ids):
    return "".join(chr(ord("a") + i % 26) for i in ids)

  prompt, lengths = _batch(GREEDY_ROWS[:1])
  free = _answers(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=24))[0]
  text = letters(free)
  letter = next(c for c in text if text.count(c) >= 2)
  first = text.index(letter)
  second = text.index(letter, first + 1)
  rows = [SamplingConfig(min_tokens=m) for m in (0, first + 1, first + 2)]
  out = _engine(engine, rule)(prompt_BxT=np.repeat(prompt, 3, axis=0),
                              lengths_B=np.repeat(lengths, 3), max_new_tokens=24,
                              sampling=rows, stop=StopStrings((letter,), letters))
  assert _answers(out) == [free[:first + 1], free[:first + 1], free[:second + 1]]
