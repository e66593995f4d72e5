"""eos_ids=[one set per row]: rows that end at different ids (one request ignores EOS, another
stops at its own stop token ids) decode in one call, each as it does alone with its own set,
in plain decoding and under every speculative rule; min_tokens holds back each row's own ids
only; bad lists are refused."""

import jax
import numpy as np
import pytest

from asd_jax.eos import is_eos
from asd_jax.plain_decode import plain_decode
from asd_jax.request_checks import check_row_eos_ids
from asd_jax.sampling import SamplingConfig
from tests.test_row_sampling import (_FNS, _PARAMS, GREEDY_ROWS, SAMPLED_ROWS, SEEDS, _answers,
                                     _batch, _engine)

MAX_NEW = 16


def _row_sets(rows):
  """Each row's own set: the token its free greedy answer holds at position 3 (rows 0, 2),
  nothing (row 1: it ignores EOS), and row 3 the token at position 5 plus row 0's."""
  prompt, lengths = _batch(rows)
  free = _answers(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=MAX_NEW))
  return [(free[0][3],), (), (free[2][3],), (free[3][5], free[0][3])]


@pytest.mark.parametrize("engine,rule,rows", [
    ("plain", None, GREEDY_ROWS), ("chain", "strict", GREEDY_ROWS),
    ("tree", "strict", GREEDY_ROWS), ("chain", "asd", GREEDY_ROWS),
    ("plain", None, SAMPLED_ROWS[:4]), ("chain", "sample", SAMPLED_ROWS[:4]),
    ("tree", "sample", SAMPLED_ROWS[:4]), ("ngram", "sample", SAMPLED_ROWS[:4])])
def test_each_row_ends_at_its_own_ids_as_alone(engine, rule, rows):
  decode = _engine(engine, rule)
  prompt, lengths = _batch(rows)
  sets = _row_sets(rows)
  together = _answers(decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=MAX_NEW,
                             eos_ids=sets, sampling=list(rows), seed=SEEDS[:4]))
  for b, own in enumerate(sets):
    alone = _answers(decode(prompt_BxT=prompt[b:b + 1, :lengths[b]], lengths_B=lengths[b:b + 1],
                            max_new_tokens=MAX_NEW, eos_ids=own, sampling=rows[b],
                            seed=SEEDS[b:b + 1]))
    assert together[b] == alone[0], (b, own)
  # The premise: ending every row at every row's ids answers otherwise.
  union = tuple(dict.fromkeys(i for s in sets for i in s))
  assert _answers(decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=MAX_NEW,
                         eos_ids=union, sampling=list(rows), seed=SEEDS[:4])) != together


def test_min_tokens_holds_back_each_rows_own_ids():
  """Every row at min_tokens 6: row b may not end before 6 tokens at its own ids, and a token
  that ends only another row is free to come early (the free greedy answers are the check)."""
  rows = [SamplingConfig(min_tokens=6)] * 4
  prompt, lengths = _batch(rows)
  sets = _row_sets(GREEDY_ROWS)
  free = _answers(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=MAX_NEW))
  together = _answers(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=MAX_NEW,
                                   eos_ids=sets, sampling=rows))
  for b, own in enumerate(sets):
    alone = _answers(plain_decode(_FNS, _PARAMS, prompt[b:b + 1], lengths[b:b + 1],
                                  max_new_tokens=MAX_NEW, eos_ids=own, sampling=rows[b]))[0]
    assert together[b] == alone
    assert not set(together[b][:5]) & set(own)
  # Row 1 ends at nothing: its answer is its free one, the others' ids early in it included.
  assert together[1] == free[1]


def test_a_set_per_row_is_one_set_when_they_agree():
  assert check_row_eos_ids([(2, 3), (3, 2)], 10, 2) == ((2, 3), None)
  assert check_row_eos_ids((2, 3), 10, 2) == ((2, 3), None)
  union, rows = check_row_eos_ids([(3,), (), [3, 2]], 10, 3)
  assert union == (2, 3) and rows.tolist() == [[False, True], [False, False], [True, True]]
  # The union is sorted: the same sets in another order give the same static ids.
  assert check_row_eos_ids([(2,), (3,)], 10, 2)[0] == check_row_eos_ids([(3,), (2,)], 10, 2)[0]
  tokens = np.array([[2, 3], [2, 3], [3, 5]])
  assert np.asarray(is_eos(tokens, union, rows)).tolist() == [[False, True], [False, False],
                                                              [True, False]]
  assert not np.asarray(is_eos(tokens, (), None)).any()


@pytest.mark.parametrize("eos_ids,error,message", [
    ([(2,), (3,)], ValueError, "eos_ids has 2 sets of ids for 6 prompt rows"),
    ([(2,)] * 5 + [(99,)], ValueError, "eos_ids[5]: eos id 99 is outside the vocabulary"),
    ([(2,)] * 5 + [(2.5,)], TypeError, "eos_ids[5]: eos_ids must be integer token ids"),
])
def test_bad_sets_are_refused(eos_ids, error, message):
  prompt, lengths = _batch(SAMPLED_ROWS)
  for engine, rule in (("plain", None), ("chain", "strict")):
    with pytest.raises(error) as e:
      _engine(engine, rule)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=4,
                            eos_ids=eos_ids)
    assert message in str(e.value)


def test_other_sets_reuse_the_compiled_loop():
  from asd_jax.plain_decode import _plain_decode as loop
  prompt, lengths = _batch(GREEDY_ROWS)
  plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6, eos_ids=[(2,), (), (5, 2), (5,)])
  before = loop._cache_size()
  plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6, eos_ids=[(), (2, 5), (5,), (2,)])
  assert loop._cache_size() == before
  jax.block_until_ready(plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=6,
                                     eos_ids=[(2,), (), (7,), (5,)]))  # another union: another
  assert loop._cache_size() > before
