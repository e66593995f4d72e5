"""What reuses a compiled decode loop instead of compiling another: requests that differ only in
max_new_tokens (the output buffer is bucketed; asd_jax/output_buffer.py), which still return the
width they asked for and exactly what a request of that length generates on its own; and a
drafter built again from the same model functions and settings (the factories return the same
drafter; asd_jax.drafter_api.DRAFTERS_KEPT)."""

import numpy as np
import pytest

from asd_jax import output_buffer
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.ngram_store import build_store
from asd_jax.plain_decode import _plain_decode, plain_decode
from asd_jax.spec_decode import _asd_decode, asd_decode
from asd_jax.tree_decode import _tree_decode, asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=3, vocab=VOCAB, num_layers=1)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.3, seed=4))
_CHAIN = lm_chain_drafter(_FNS, 3)
_TREE = lm_tree_drafter(_FNS, TreeShape(depth=3, top_k=2, num_nodes=5))
_ENGINES = {
    "plain": (lambda **kw: plain_decode(_FNS, _PARAMS, **kw), _plain_decode),
    "chain": (lambda **kw: asd_decode(_FNS, _PARAMS, _CHAIN, _DRAFT_PARAMS, **kw),
              _asd_decode),
    "tree": (lambda **kw: asd_tree_decode(_FNS, _PARAMS, _TREE, _DRAFT_PARAMS, **kw),
             _tree_decode),
}


def test_buffer_width_rounds_up_to_the_bucket():
  bucket = output_buffer.OUTPUT_BUCKET
  assert [output_buffer.buffer_width(n) for n in (1, bucket, bucket + 1)] == [
      bucket, bucket, 2 * bucket]


@pytest.mark.parametrize("engine", sorted(_ENGINES))
def test_lengths_in_one_bucket_share_a_program_and_keep_their_width(engine):
  decode, loop = _ENGINES[engine]
  prompt, lengths = random_prompts(np.random.RandomState(0), 2, 7, VOCAB)
  kw = dict(prompt_BxT=prompt, lengths_B=lengths, logprobs=True, top_logprobs=2)
  longest = decode(max_new_tokens=11, **kw)  # compiles (or finds) the program for the bucket
  programs = loop._cache_size()
  for n in (3, 7):
    out = decode(max_new_tokens=n, **kw)
    assert out.tokens_BxN.shape == (2, n) and out.logprobs_BxN.shape == (2, n)
    assert out.top_token_ids_BxNxL.shape == out.top_logprobs_BxNxL.shape == (2, n, 2)
    # Greedy: a shorter request is the longer one's beginning, token and log-probability.
    np.testing.assert_array_equal(np.asarray(out.num_generated_B), [n, n])
    np.testing.assert_array_equal(out.tokens_BxN, np.asarray(longest.tokens_BxN)[:, :n])
    np.testing.assert_allclose(out.logprobs_BxN, np.asarray(longest.logprobs_BxN)[:, :n],
                               atol=1e-5)
  assert loop._cache_size() == programs, "a shorter max_new_tokens compiled another program"


def test_a_drafter_built_again_is_the_same_drafter_and_compiles_nothing():
  prompt, lengths = random_prompts(np.random.RandomState(1), 2, 7, VOCAB)
  store = build_store([list(range(1, 30))], VOCAB, min_n=2, max_n=3)
  builders = {
      "chain": lambda: lm_chain_drafter(_FNS, 3),
      "tree": lambda: lm_tree_drafter(_FNS, TreeShape(depth=3, top_k=2, num_nodes=5)),
      "ngram": lambda: ngram_drafter(3, VOCAB),
      "ngram+store": lambda: ngram_drafter(3, VOCAB, store=store),
  }
  for name, build in builders.items():
    assert build() is build(), name
  # Other settings, another store or other model functions: another drafter.
  assert lm_chain_drafter(_FNS, 2) is not lm_chain_drafter(_FNS, 3)
  assert ngram_drafter(3, VOCAB, store=build_store([list(range(1, 30))], VOCAB, min_n=2,
                                                   max_n=3)) is not builders["ngram+store"]()
  other_fns, _ = decoder_fns(random_decoder(seed=3, vocab=VOCAB, num_layers=1))
  assert lm_chain_drafter(other_fns, 3) is not lm_chain_drafter(_FNS, 3)

  kw = dict(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=6)
  first = asd_decode(_FNS, _PARAMS, builders["chain"](), _DRAFT_PARAMS, **kw)
  programs = _asd_decode._cache_size()
  again = asd_decode(_FNS, _PARAMS, builders["chain"](), _DRAFT_PARAMS, **kw)
  assert _asd_decode._cache_size() == programs, "a rebuilt drafter compiled another loop"
  np.testing.assert_array_equal(again.tokens_BxN, first.tokens_BxN)
