"""What reuses a compiled decode loop instead of compiling another: requests that differ only in
max_new_tokens (the output buffer is bucketed; asd_jax/output_buffer.py), which still return the
width they asked for and exactly what a request of that length generates on its own; and a
drafter built again from the same model functions and settings (the factories return the same
drafter; asd_jax.drafter_api.DRAFTERS_KEPT); and model functions built again for a decoder of
the same architecture (models.lm_fns.ARCHITECTURES_KEPT)."""

import dataclasses

import flax.nnx as nnx
import numpy as np
import pytest

from asd_jax import output_buffer
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.ngram_store import build_store
from asd_jax.plain_decode import _plain_decode, plain_decode
from asd_jax.request_checks import param_shapes
from asd_jax.spec_decode import _asd_decode, asd_decode
from asd_jax.tree_decode import _tree_decode, asd_tree_decode
from models import lm_fns
from models.eagle3 import Eagle3Config, eagle3_fns, init_eagle3
from models.feature_drafters import eagle3_tree_drafter, medusa_tree_drafter
from models.lm_fns import decoder_fns
from models.medusa import MedusaConfig, init_medusa
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
  other_fns, _ = decoder_fns(random_decoder(seed=3, vocab=VOCAB, num_layers=2))
  assert lm_chain_drafter(other_fns, 3) is not lm_chain_drafter(_FNS, 3)

  kw = dict(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=6)
  first = asd_decode(_FNS, _PARAMS, builders["chain"](), _DRAFT_PARAMS, **kw)
  programs = _asd_decode._cache_size()
  again = asd_decode(_FNS, _PARAMS, builders["chain"](), _DRAFT_PARAMS, **kw)
  assert _asd_decode._cache_size() == programs, "a rebuilt drafter compiled another loop"
  np.testing.assert_array_equal(again.tokens_BxN, first.tokens_BxN)


def test_a_decoder_of_the_same_architecture_gets_the_same_functions_and_its_own_tokens():
  # The module's _FNS came from the cache at import; the cache keeps ARCHITECTURES_KEPT entries,
  # and the tests this worker ran since may have pushed it out. So ask for it now.
  base = decoder_fns(_TARGET)[0]
  other_seed = random_decoder(seed=8, vocab=VOCAB, num_layers=1)
  fns, params = decoder_fns(other_seed)
  assert fns is base  # same config and graph, other weights
  # Another architecture, other hidden-layer outputs or another name: other functions.
  assert decoder_fns(random_decoder(seed=3, vocab=VOCAB, num_layers=2))[0] is not base
  assert decoder_fns(_TARGET, hidden_layers=(0,))[0] is not base
  assert decoder_fns(_TARGET, hidden_layers=[0])[0] is decoder_fns(_TARGET, (0,))[0]
  assert decoder_fns(_TARGET, name="target")[0] is not base

  prompt, lengths = random_prompts(np.random.RandomState(2), 2, 7, VOCAB)
  kw = dict(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=6)
  plain_decode(base, _PARAMS, **kw)
  programs = _plain_decode._cache_size()
  shared = plain_decode(fns, params, **kw)
  assert _plain_decode._cache_size() == programs, "the same architecture compiled another loop"
  # The weights are arguments: the shared program decodes the other model, not the first one.
  own_fns = lm_fns._decoder_fns.__wrapped__(*_split_key(other_seed))
  assert own_fns is not base
  own = plain_decode(own_fns, params, **kw)
  np.testing.assert_array_equal(shared.tokens_BxN, own.tokens_BxN)
  assert not np.array_equal(shared.tokens_BxN, plain_decode(base, _PARAMS, **kw).tokens_BxN)


def _split_key(model):
  """decoder_fns's cache key for `model` (no hidden layers, the default name)."""
  graphdef, params = nnx.split(model)
  return graphdef, model.cfg, (), "decoder", param_shapes(params)


def test_feature_drafters_of_the_same_architecture_are_the_same_drafter():
  target = random_decoder(seed=5, vocab=VOCAB, num_layers=4)
  cfg = Eagle3Config.for_target(target.cfg, draft_vocab_size=40, fused_layers=(0, 1, 3))
  fns, _ = eagle3_fns(init_eagle3(cfg, seed=1, target=target))
  assert eagle3_fns(init_eagle3(cfg, seed=2, target=target))[0] is fns
  shape = TreeShape(depth=3, top_k=2, num_nodes=5)
  assert eagle3_tree_drafter(eagle3_fns(init_eagle3(cfg, seed=2, target=target))[0],
                             shape) is eagle3_tree_drafter(fns, shape)
  other = Eagle3Config.for_target(target.cfg, draft_vocab_size=30, fused_layers=(0, 1, 3))
  assert eagle3_fns(init_eagle3(other, seed=1, target=target))[0] is not fns

  medusa = MedusaConfig(hidden_size=target.cfg.hidden_size, vocab_size=VOCAB, num_heads=3)
  drafter = medusa_tree_drafter(init_medusa(medusa, seed=1, target=target), target, shape)
  assert medusa_tree_drafter(init_medusa(medusa, seed=2, target=target), target,
                             shape) is drafter
  assert medusa_tree_drafter(init_medusa(medusa, seed=1, target=target), target,
                             TreeShape(depth=2, top_k=2, num_nodes=4)) is not drafter
  own_head = dataclasses.replace(medusa, own_head=True)
  assert medusa_tree_drafter(init_medusa(own_head, seed=1, target=target), target,
                             shape) is not drafter
