"""EAGLE-3 and Medusa drafters inside the tree engine; a chain as a tree equals the chain engine."""

import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.spec_decode import asd_decode
from asd_jax.tree_decode import asd_tree_decode
from models.eagle3 import Eagle3Config, eagle3_fns, init_eagle3, reduced_vocab_map, set_vocab_map
from models.feature_drafters import (eagle3_tree_drafter, medusa_choices, medusa_drafter_params,
                                     medusa_tree_drafter)
from models.lm_fns import decoder_fns
from models.medusa import MedusaConfig, init_medusa
from tests.test_spec_decode import _assert_equal_up_to_near_ties
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=4)


def _greedy_equality(drafter, dparams, target_fns, tparams, batch=3, cases=3):
  for case in range(cases):
    prompt, lengths = random_prompts(np.random.RandomState(case), batch, 9, VOCAB)
    want = plain_decode(target_fns, tparams, prompt, lengths, max_new_tokens=18).tokens_BxN
    for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(0.0, 0.5, 2))):
      out = asd_tree_decode(target_fns, tparams, drafter, dparams, prompt, lengths,
                            max_new_tokens=18, rule=rule, asd_config=cfg)
      _assert_equal_up_to_near_ties(tparams, prompt, lengths, out.tokens_BxN, want)
  return out


@pytest.mark.parametrize("shape", [TreeShape(3, 2, 6), TreeShape(4, 1, 4)])
def test_eagle3_trees_equal_plain_greedy(shape):
  cfg = Eagle3Config.for_target(_TARGET.cfg, draft_vocab_size=40, fused_layers=(0, 1, 3))
  model = init_eagle3(cfg, seed=3, target=_TARGET)
  counts = np.random.RandomState(0).randint(0, 100, VOCAB)
  set_vocab_map(model, *reduced_vocab_map(counts, 40))
  fns, dparams = eagle3_fns(model)
  drafter = eagle3_tree_drafter(fns, shape)
  assert drafter.max_positions == cfg.max_position_embeddings  # its window, for the warning
  target_fns, tparams = decoder_fns(_TARGET, hidden_layers=drafter.feature_layers)
  _greedy_equality(drafter, dparams, target_fns, tparams)


@pytest.mark.parametrize("own_head", [False, True])
def test_medusa_trees_equal_plain_greedy(own_head):
  heads = init_medusa(MedusaConfig(hidden_size=_TARGET.cfg.hidden_size, vocab_size=VOCAB,
                                   num_heads=3, own_head=own_head), seed=1, target=_TARGET)
  drafter = medusa_tree_drafter(heads, _TARGET, TreeShape(3, 2, 7))
  target_fns, tparams = decoder_fns(_TARGET, hidden_layers=drafter.feature_layers)
  _greedy_equality(drafter, medusa_drafter_params(heads, _TARGET), target_fns, tparams)


def test_medusa_refuses_sampling():
  heads = init_medusa(MedusaConfig(hidden_size=_TARGET.cfg.hidden_size, vocab_size=VOCAB,
                                   num_heads=2), seed=1)
  drafter = medusa_tree_drafter(heads, _TARGET, TreeShape(2, 2, 4))
  target_fns, tparams = decoder_fns(_TARGET, hidden_layers=drafter.feature_layers)
  with pytest.raises(ValueError, match="deterministic"):
    asd_tree_decode(target_fns, tparams, drafter, medusa_drafter_params(heads, _TARGET),
                    np.array([[1, 2]]), np.array([2]), max_new_tokens=4, rule="sample",
                    sampling=SamplingConfig(temperature=1.0))


def test_medusa_choices_are_prefix_closed():
  choices = medusa_choices(TreeShape(3, 3, 10), num_heads=3)
  assert len(choices) == 10 and choices[0] == (0,)
  assert all(len(p) == 1 or p[:-1] in choices for p in choices)


def test_eagle3_and_medusa_refuse_another_drafters_params():
  eagle_cfg = Eagle3Config.for_target(_TARGET.cfg, fused_layers=(0, 1, 3))
  fns, _ = eagle3_fns(init_eagle3(eagle_cfg, seed=3, target=_TARGET))
  heads = init_medusa(MedusaConfig(hidden_size=_TARGET.cfg.hidden_size, vocab_size=VOCAB,
                                   num_heads=2), seed=1)
  medusa = medusa_tree_drafter(heads, _TARGET, TreeShape(2, 2, 4))
  medusa_params = medusa_drafter_params(heads, _TARGET)
  eagle = eagle3_tree_drafter(fns, TreeShape(2, 1, 2))
  for drafter, wrong in ((eagle, medusa_params), (medusa, eagle3_fns(init_eagle3(
      eagle_cfg, seed=3, target=_TARGET))[1])):
    target_fns, tparams = decoder_fns(_TARGET, hidden_layers=drafter.feature_layers)
    with pytest.raises(ValueError, match="drafter_params hold .* arrays, model '(eagle3|medusa)' "
                                         "has .*another model's parameters"):
      asd_tree_decode(target_fns, tparams, drafter, wrong, np.array([[1, 2]]), np.array([2]),
                      max_new_tokens=4)


def test_target_without_the_drafters_features_is_refused():
  cfg = Eagle3Config.for_target(_TARGET.cfg, fused_layers=(0, 1, 3))
  fns, dparams = eagle3_fns(init_eagle3(cfg, seed=3, target=_TARGET))
  target_fns, tparams = decoder_fns(_TARGET)  # no hidden layers
  with pytest.raises(ValueError, match="hidden_layers"):
    asd_tree_decode(target_fns, tparams, eagle3_tree_drafter(fns, TreeShape(2, 1, 2)), dparams,
                    np.array([[1, 2]]), np.array([2]), max_new_tokens=4)


def test_chain_as_tree_equals_chain_engine_tokens_and_stats():
  target_fns, tparams = decoder_fns(_TARGET)
  dparams = decoder_fns(perturbed_copy(_TARGET, 0.2, seed=4))[1]
  prompt, lengths = random_prompts(np.random.RandomState(3), 4, 9, VOCAB)
  k = 4
  for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(3.0, 0.5, 2))):
    chain = asd_decode(target_fns, tparams, lm_chain_drafter(target_fns, k), dparams, prompt,
                       lengths, max_new_tokens=20, rule=rule, asd_config=cfg)
    tree = asd_tree_decode(target_fns, tparams, lm_tree_drafter(target_fns, TreeShape(k, 1, k)),
                           dparams, prompt, lengths, max_new_tokens=20, rule=rule,
                           asd_config=cfg)
    np.testing.assert_array_equal(chain.tokens_BxN, tree.tokens_BxN)
    for field in ("rounds_B", "accepted_B", "accepted_per_position_BxK", "asd_exceptions_B"):
      np.testing.assert_array_equal(getattr(chain.stats, field), getattr(tree.stats, field))
    np.testing.assert_allclose(chain.stats.asd_spent_B, tree.stats.asd_spent_B, rtol=1e-5)


def test_feature_tree_rounds_compile_to_no_loop_of_their_own_on_a_gpu():
  """Lowered for CUDA (no GPU needed), the tree engine with an EAGLE-3 head (tree and top-1
  chain) or Medusa heads holds one while loop, the rounds' (see tests/lowering.py)."""
  from tests.lowering import tree_engine_loops
  cfg = Eagle3Config.for_target(_TARGET.cfg, draft_vocab_size=40, fused_layers=(0, 1, 3))
  model = init_eagle3(cfg, seed=3, target=_TARGET)
  set_vocab_map(model, *reduced_vocab_map(np.random.RandomState(0).randint(0, 100, VOCAB), 40))
  fns, eagle_params = eagle3_fns(model)
  heads = init_medusa(MedusaConfig(hidden_size=_TARGET.cfg.hidden_size, vocab_size=VOCAB,
                                   num_heads=3), seed=1, target=_TARGET)
  for drafter, dparams in ((eagle3_tree_drafter(fns, TreeShape(4, 4, 16)), eagle_params),
                           (eagle3_tree_drafter(fns, TreeShape(3, 1, 3)), eagle_params),
                           (medusa_tree_drafter(heads, _TARGET, TreeShape(3, 2, 7)),
                            medusa_drafter_params(heads, _TARGET))):
    target_fns, tparams = decoder_fns(_TARGET, hidden_layers=drafter.feature_layers)
    assert tree_engine_loops(target_fns, tparams, drafter, dparams, "cuda") == 1, drafter.name
