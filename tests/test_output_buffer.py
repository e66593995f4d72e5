"""Requests that differ only in max_new_tokens share one compiled decode program (the output
buffer is bucketed; asd_jax/output_buffer.py), return the width they asked for, and generate
exactly what a request of that length generates on its own."""

import numpy as np
import pytest

from asd_jax import output_buffer
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import _plain_decode, plain_decode
from asd_jax.spec_decode import _asd_decode, asd_decode
from asd_jax.tree_decode import _tree_decode, asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_FNS, _PARAMS = decoder_fns(random_decoder(seed=3, vocab=VOCAB, num_layers=1))
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(random_decoder(seed=3, vocab=VOCAB,
                                                             num_layers=1), 0.3, seed=4))
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
