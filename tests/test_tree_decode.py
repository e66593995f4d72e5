"""Tree speculative decoding: tree attention, KV compaction, greedy equality, losslessness."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig, probabilities
from asd_jax.tree_decode import asd_tree_decode, tree_attention
from models.kv_cache import KVCache, move_slots
from models.lm_fns import decoder_fns
from tests.test_spec_decode import _assert_equal_up_to_near_ties
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61  # the vocabulary of tests.test_spec_decode's near-tie helper
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_TFNS, _TPARAMS = decoder_fns(_TARGET)


def test_tree_attention_logits_equal_each_nodes_root_path_as_a_sequence():
  # Tree: root -> a(0) -> c(2) -> e(4); root -> b(1) -> d(3); a(0) -> f(5)
  parents = np.array([[-1, -1, 0, 1, 2, 0]], np.int32)
  tokens = np.array([[5, 9, 17, 23, 31, 40]], np.int32)
  prefix = [3, 14, 15, 9, 2]  # committed; the last one is the root
  n = len(prefix)
  capacity = 32
  forward = jax.jit(_TFNS.forward)
  cache = _TFNS.init_cache(1, capacity)
  _, _, cache = forward(_TPARAMS, jnp.asarray([prefix[:-1]]), jnp.arange(n - 1)[None], cache)
  slots, depth, visible, _ = tree_attention(jnp.asarray(parents), jnp.array([n]), capacity, 6)
  block = jnp.concatenate([jnp.array([[prefix[-1]]]), jnp.asarray(tokens)], axis=1)
  tree_logits, _, _ = jax.jit(_TFNS.tree_forward)(_TPARAMS, block, (n - 1) + depth, slots,
                                                  visible, cache)
  paths = {0: [0], 1: [1], 2: [0, 2], 3: [1, 3], 4: [0, 2, 4], 5: [0, 5]}
  for node, path in paths.items():
    seq = prefix + [int(tokens[0, i]) for i in path]
    full, _, _ = forward(_TPARAMS, jnp.asarray([seq]), jnp.arange(len(seq))[None],
                         _TFNS.init_cache(1, capacity))
    np.testing.assert_allclose(np.asarray(tree_logits[0, node + 1]),
                               np.asarray(full[0, -1]), atol=1e-4)
  np.testing.assert_allclose(np.asarray(tree_logits[0, 0]), np.asarray(full[0, n - 1]),
                             atol=1e-4)


def test_move_slots_compacts_and_drops_out_of_range():
  cfg = _TARGET.cfg
  cache = KVCache.create(cfg, 2, 8)
  marks = jnp.arange(8, dtype=jnp.float32)
  cache = KVCache(k=tuple(jnp.broadcast_to(marks[None, None, None, :], c.shape) for c in cache.k),
                  v=tuple(jnp.broadcast_to(marks[None, None, :, None], c.shape) for c in cache.v))
  moved = move_slots(cache, jnp.array([[5, 7], [3, 3]]), jnp.array([[2, 3], [1, 8]]))
  for got in (np.asarray(moved.k[0][:, 0, 0, :]), np.asarray(moved.v[0][:, 0, :, 0])):
    assert got[0].tolist() == [0, 1, 5, 7, 4, 5, 6, 7]
    assert got[1].tolist() == [0, 3, 2, 3, 4, 5, 6, 7]  # slot 8 is outside: dropped


SHAPES = [(1, TreeShape(2, 2, 3)), (4, TreeShape(3, 2, 6)), (3, TreeShape(4, 3, 12)),
          (2, TreeShape(1, 1, 1)),
          (2, TreeShape(4, 2, 2))]  # fewer nodes than the depth: paths are at most 2 deep


@pytest.mark.parametrize("batch,shape", SHAPES)
def test_strict_and_asd_budget0_trees_equal_plain_greedy(batch, shape):
  target = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
  drafter = lm_tree_drafter(_TFNS, shape)
  for case in range(4):
    seed = 20 + case
    tparams = decoder_fns(random_decoder(seed=seed, vocab=VOCAB, num_layers=2))[1]
    dparams = decoder_fns(perturbed_copy(nnx_merge_like(target, tparams), 0.15, seed=seed))[1]
    prompt, lengths = random_prompts(np.random.RandomState(seed), batch, 10, VOCAB)
    want = plain_decode(_TFNS, tparams, prompt, lengths, max_new_tokens=20).tokens_BxN
    for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(0.0, 0.5, 2))):
      got = asd_tree_decode(_TFNS, tparams, drafter, dparams, prompt, lengths,
                            max_new_tokens=20, rule=rule, asd_config=cfg)
      _assert_equal_up_to_near_ties(tparams, prompt, lengths, got.tokens_BxN, want)


def nnx_merge_like(model, params):
  import flax.nnx as nnx
  graphdef, _ = nnx.split(model)
  return nnx.merge(graphdef, params)


def test_chain_shaped_self_draft_tree_accepts_everything():
  shape = TreeShape(depth=3, top_k=1, num_nodes=3)
  prompt, lengths = random_prompts(np.random.RandomState(1), 2, 6, VOCAB)
  out = asd_tree_decode(_TFNS, _TPARAMS, lm_tree_drafter(_TFNS, shape), _TPARAMS, prompt,
                        lengths, max_new_tokens=17)
  rounds, accepted = np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)
  assert (accepted >= 3 * (rounds - 1)).all()
  want = plain_decode(_TFNS, _TPARAMS, prompt, lengths, max_new_tokens=17).tokens_BxN
  np.testing.assert_array_equal(out.tokens_BxN, want)


def test_a_tree_round_compiles_to_no_loop_of_its_own_on_a_gpu():
  """Lowered for CUDA (no GPU needed), the tree engine holds one while loop, the rounds': the
  tree's root paths, found once to verify and once to compact the cache, loop over no depth
  inside a round, where on a GPU every loop step costs kernel launches and a read of its
  condition."""
  from tests.lowering import tree_engine_loops
  drafter = lm_tree_drafter(_TFNS, TreeShape(4, 4, 16))
  assert tree_engine_loops(_TFNS, _TPARAMS, drafter, _TPARAMS, "cuda") == 1


def test_asd_tree_ledger_is_bounded():
  tparams = _TPARAMS
  dparams = decoder_fns(perturbed_copy(_TARGET, 0.4, seed=5))[1]
  prompt, lengths = random_prompts(np.random.RandomState(2), 4, 8, VOCAB)
  out = asd_tree_decode(_TFNS, tparams, lm_tree_drafter(_TFNS, TreeShape(3, 2, 6)), dparams,
                        prompt, lengths, max_new_tokens=24, rule="asd",
                        asd_config=ASDConfig(2.0, 0.5, 2))
  spent = np.asarray(out.stats.asd_spent_B)
  assert (spent <= 2.0).all() and (np.asarray(out.stats.asd_exceptions_B).sum() > 0)


def test_tree_rows_do_not_depend_on_the_batch():
  """Greedy tree rows (strict, and ASD spending its ledger) decode alike alone and in a batch of
  other prompts and lengths: rejected branches, compaction and the ledger stay per row."""
  dparams = decoder_fns(perturbed_copy(_TARGET, 0.4, seed=5))[1]
  prompt, lengths = random_prompts(np.random.RandomState(9), 5, 11, VOCAB)
  drafter = lm_tree_drafter(_TFNS, TreeShape(3, 2, 6))
  for rule in ("strict", "asd"):
    kw = dict(max_new_tokens=16, rule=rule, asd_config=ASDConfig(2.0, 0.5, 2))
    together = asd_tree_decode(_TFNS, _TPARAMS, drafter, dparams, prompt, lengths, **kw)
    if rule == "asd":  # the ledger is really in use
      assert np.asarray(together.stats.asd_exceptions_B).sum() > 0
    for b in range(5):
      alone = asd_tree_decode(_TFNS, _TPARAMS, drafter, dparams, prompt[b:b + 1],
                              lengths[b:b + 1], **kw)
      np.testing.assert_array_equal(alone.tokens_BxN[0], together.tokens_BxN[b])
      assert int(alone.stats.rounds_B[0]) == int(together.stats.rounds_B[b])
      # Logits of different batch shapes may differ in the last float bits.
      np.testing.assert_allclose(alone.stats.asd_spent_B[0], together.stats.asd_spent_B[b],
                                 rtol=1e-5)


def test_tree_sampling_is_lossless_end_to_end():
  v, prompt_ids, rows = 16, [3, 7, 1], 40_000
  target = random_decoder(seed=11, vocab=v, num_layers=2, hidden=32)
  fns, tparams = decoder_fns(target)
  dparams = decoder_fns(perturbed_copy(target, 0.6, seed=3))[1]
  sampling = SamplingConfig(temperature=1.0)
  # Exact joint of the first two generated tokens.
  ids = np.array([prompt_ids + [a] for a in range(v)], np.int32)
  logits = jax.jit(fns.forward)(tparams, jnp.asarray(ids), jnp.broadcast_to(
      jnp.arange(4), ids.shape), fns.init_cache(v, 4))[0]
  p1 = np.asarray(probabilities(logits[:1, 2], sampling), np.float64)[0]
  p2 = np.asarray(probabilities(logits[:, 3], sampling), np.float64)
  exact = p1[:, None] * p2
  drafter = lm_tree_drafter(fns, TreeShape(2, 2, 6))
  counts = np.zeros((v, v))
  for seed in range(3):
    out = asd_tree_decode(fns, tparams, drafter, dparams, np.tile([prompt_ids], (rows, 1)),
                          np.full((rows,), 3), max_new_tokens=2, rule="sample",
                          sampling=sampling, seed=seed, capacity=24)
    tok = np.asarray(out.tokens_BxN)
    np.add.at(counts, (tok[:, 0], tok[:, 1]), 1)
  tv = 0.5 * np.abs(counts / counts.sum() - exact).sum()
  assert tv <= 0.02, tv


@pytest.mark.parametrize("args,match", [((0, 2, 2), "depth"), ((2, 2, 7), "exceeds"),
                                        ((2, 0, 1), "top_k")])
def test_bad_tree_shapes(args, match):
  with pytest.raises(ValueError, match=match):
    TreeShape(*args)


def test_tree_flag_parsing():
  assert TreeShape.parse("4,3,12") == TreeShape(4, 3, 12)
  with pytest.raises(ValueError, match="DEPTH,TOPK,NODES"):
    TreeShape.parse("4,3")


def test_integral_float_tree_sizes_become_ints():
  """4.0 is taken as 4 (as ChainDrafter takes K), so the derived sizes that shape the tree's
  arrays are ints, not 14.0."""
  shape = TreeShape(4.0, 2, 3.0)
  assert shape == TreeShape(4, 2, 3)
  assert type(shape.depth) is int and type(shape.pool_size) is int and type(shape.window) is int
