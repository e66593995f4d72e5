"""A decode call's stream and stop strings are found by a traced call id: new ones per request
compile nothing, concurrent calls each get their own, and nothing stays registered."""

import concurrent.futures

import numpy as np
import pytest

from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.host_calls import active_calls
from asd_jax.plain_decode import _plain_decode, plain_decode
from asd_jax.spec_decode import _asd_decode, asd_decode
from asd_jax.stop_strings import StopStrings
from asd_jax.token_stream import TokenStream
from asd_jax.tree_decode import _tree_decode, asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.1, seed=5))
_TREE = TreeShape(depth=3, top_k=2, num_nodes=6)


def _decode(ids) -> str:
  return "".join("abcd"[t % 4] for t in ids)


def _engine(name):
  """(decode(**kw), the jitted loop it runs)."""
  if name == "plain":
    return lambda **kw: plain_decode(_FNS, _PARAMS, **kw), _plain_decode
  if name == "chain":
    chain = lm_chain_drafter(_FNS, 3)  # one drafter object: a new one would compile again
    return lambda **kw: asd_decode(_FNS, _PARAMS, chain, _DRAFT_PARAMS, **kw), _asd_decode
  tree = lm_tree_drafter(_FNS, _TREE)
  return lambda **kw: asd_tree_decode(_FNS, _PARAMS, tree, _DRAFT_PARAMS, **kw), _tree_decode


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_a_new_stream_and_new_stop_strings_compile_nothing(engine):
  decode, loop = _engine(engine)
  prompt, lengths = random_prompts(np.random.RandomState(0), 2, 8, VOCAB)
  seen = []
  decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=12,
         stream=TokenStream(lambda row, tokens: seen.append(1)),
         stop=StopStrings(("dddd",), _decode))
  compiled = loop._cache_size()
  for strings in [("ab",), ("cc", "ddd")]:
    seen.clear()
    result = decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=12,
                    stream=TokenStream(lambda row, tokens: seen.append(1)),
                    stop=StopStrings(strings, _decode))
    assert seen  # the new stream was called
    for b in range(2):  # and the new stop strings were applied
      n = int(result.num_generated_B[b])
      tokens = np.asarray(result.tokens_BxN[b, :n]).tolist()
      assert n == 12 or any(s in _decode(tokens) for s in strings)
      assert not any(s in _decode(tokens[:-1]) for s in strings)
  assert loop._cache_size() == compiled
  assert active_calls() == 0


def test_concurrent_calls_each_use_their_own_stop_strings():
  prompt, lengths = random_prompts(np.random.RandomState(1), 1, 8, VOCAB)
  full = np.asarray(plain_decode(_FNS, _PARAMS, prompt, lengths,
                                 max_new_tokens=24).tokens_BxN[0]).tolist()
  text = _decode(full)
  # Two stop strings met at different tokens of the same answer.
  early, late = text[3:5], text[18:21]
  assert text.find(early) < text.find(late)

  def stopped_length(stop_text):
    result = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=24,
                          stop=StopStrings((stop_text,), _decode))
    return int(result.num_generated_B[0])

  expected = {s: stopped_length(s) for s in (early, late)}
  assert expected[early] < expected[late]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    jobs = [(s, pool.submit(stopped_length, s)) for s in [early, late] * 4]
    assert [job.result() for _, job in jobs] == [expected[s] for s, _ in jobs]
  assert active_calls() == 0


def test_a_failing_call_leaves_nothing_registered():
  prompt, lengths = random_prompts(np.random.RandomState(2), 1, 6, VOCAB)

  def bad_decode(ids):
    raise RuntimeError("tokenizer failed")

  with pytest.raises(RuntimeError, match="tokenizer failed"):
    plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=4,
                 stop=StopStrings(("a",), bad_decode))
  assert active_calls() == 0
