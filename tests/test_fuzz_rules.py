"""Hypothesis fuzzing of the verification rules and the draft-tree builder over random shapes
and values, including NaN/inf rows and exact ties. Cross-rule invariants (test_asd_verify holds
the per-rule ones): budget 0 == strict, chain == chain-shaped tree, bounds on every output,
bad rows flagged and isolated, and every built tree well formed."""

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from asd_jax import (ASDConfig, NONFINITE_TOKEN, asd_verify, greedy_verify, tree_asd_verify,
                     tree_greedy_verify)
from asd_jax.draft_tree import TreeShape, grow_dynamic_tree
from asd_jax.sampling import SamplingConfig

FUZZ = settings(max_examples=12, deadline=None)


@st.composite
def blocks(draw):
  b, k, v = draw(st.sampled_from([1, 3])), draw(st.integers(1, 4)), draw(st.sampled_from([5, 9]))
  rng = np.random.RandomState(draw(st.integers(0, 2 ** 31 - 1)))
  # Few distinct logit values make exact ties common.
  logits = rng.choice([-2.0, 0.0, 0.5, 1.0, 3.0], size=(b, k + 1, v)).astype(np.float32)
  if draw(st.booleans()):
    logits += rng.normal(0, draw(st.sampled_from([0.01, 1.0])), logits.shape).astype(np.float32)
  bad = np.zeros(b, bool)
  if draw(st.booleans()):
    row = rng.randint(b)
    logits[row, rng.randint(k + 1), rng.randint(v)] = draw(st.sampled_from([np.nan, np.inf]))
    bad[row] = True
  best = np.argmax(np.nan_to_num(logits, nan=0.0), axis=-1)[:, :k]
  draft = np.where(rng.rand(b, k) < 0.6, best, rng.randint(0, v, (b, k))).astype(np.int32)
  spent = rng.uniform(0, 3, b).astype(np.float32)
  return draft, logits, spent, bad


@FUZZ
@given(blocks(), st.sampled_from([0.0, 0.7, 4.0]), st.sampled_from([0.0, 0.3, 2.0]),
       st.integers(0, 3))
def test_chain_rules_invariants(block, budget, gate, m):
  draft, logits, spent, bad = block
  k = draft.shape[1]
  budget = max(budget, float(spent.max()))  # a ledger never above its budget
  cfg = ASDConfig(budget, gate, m)
  out = asd_verify(draft, logits, spent, cfg)
  strict = greedy_verify(draft, logits, spent)
  a, s = np.asarray(out.num_accepted), np.asarray(out.spent)
  assert ((0 <= a) & (a <= k)).all()
  assert (s >= spent - 1e-6).all() and (s <= budget + 1e-5).all()
  assert (np.asarray(out.num_exceptions) <= m).all()
  assert (np.asarray(out.num_accepted) >= np.asarray(strict.num_accepted)).all()
  # Non-finite rows are flagged, accept nothing and emit the sentinel; the others are not.
  flagged = np.asarray(out.nonfinite)
  np.testing.assert_array_equal(flagged, bad)
  np.testing.assert_array_equal(np.asarray(strict.nonfinite), bad)
  assert (a[bad] == 0).all() and (np.asarray(out.next_token)[bad] == NONFINITE_TOKEN).all()
  assert (np.asarray(out.next_token)[~bad] >= 0).all()
  # Budget 0 is strict, field by field.
  zero = asd_verify(draft, logits, spent, ASDConfig(0.0, gate, m))
  for f in ("num_accepted", "next_token", "spent", "num_exceptions", "nonfinite"):
    np.testing.assert_array_equal(np.asarray(getattr(zero, f)), np.asarray(getattr(strict, f)))


@FUZZ
@given(blocks(), st.sampled_from([0.0, 4.0]))
def test_chain_given_as_a_tree_verifies_the_same(block, budget):
  draft, logits, spent, _ = block
  b, k = draft.shape
  parents = np.broadcast_to(np.arange(k, dtype=np.int32) - 1, (b, k))
  cfg = ASDConfig(max(budget, float(spent.max())), 0.5, 2)
  for chain, tree in ((greedy_verify(draft, logits, spent),
                       tree_greedy_verify(draft, parents, logits, spent)),
                      (asd_verify(draft, logits, spent, cfg),
                       tree_asd_verify(draft, parents, logits, spent, cfg))):
    for f in ("num_accepted", "next_token", "num_exceptions", "nonfinite"):
      np.testing.assert_array_equal(np.asarray(getattr(tree, f)), np.asarray(getattr(chain, f)))
    np.testing.assert_allclose(np.asarray(tree.spent), np.asarray(chain.spent), rtol=1e-6)


@st.composite
def trees(draw):
  b, n, v = draw(st.sampled_from([1, 2])), draw(st.integers(1, 7)), draw(st.sampled_from([4, 7]))
  rng = np.random.RandomState(draw(st.integers(0, 2 ** 31 - 1)))
  parents = np.array([[rng.randint(-1, i) for i in range(n)] for _ in range(b)], np.int32)
  logits = rng.choice([0.0, 1.0, 2.0], size=(b, n + 1, v)).astype(np.float32)
  logits += rng.normal(0, 0.3, logits.shape).astype(np.float32)
  best = np.argmax(logits, axis=-1)
  tokens = np.where(rng.rand(b, n) < 0.6, np.take_along_axis(best, parents + 1, axis=1),
                    rng.randint(0, v, (b, n))).astype(np.int32)
  return tokens, parents, logits


@FUZZ
@given(trees(), st.sampled_from([0.0, 1.0, 5.0]))
def test_tree_rules_pick_a_real_root_path(tree, budget):
  tokens, parents, logits = tree
  b, n = tokens.shape
  spent = np.zeros(b, np.float32)
  strict = tree_greedy_verify(tokens, parents, logits, spent)
  out = tree_asd_verify(tokens, parents, logits, spent, ASDConfig(budget, 0.5, 2))
  best = np.argmax(logits, axis=-1)
  for res, is_strict in ((strict, True), (out, False)):
    path, a = np.asarray(res.path), np.asarray(res.num_accepted)
    assert ((0 <= a) & (a <= n)).all() and (np.asarray(res.spent) <= budget + 1e-5).all()
    for r in range(b):
      prev = -1
      for i in range(a[r]):
        node = path[r, i]
        assert 0 <= node < n and parents[r, node] == prev  # a chain from the root
        if is_strict:
          assert tokens[r, node] == best[r, prev + 1]
        prev = node
      assert (path[r, a[r]:] == -1).all()
      assert np.asarray(res.next_token)[r] == best[r, prev + 1]  # argmax after the path
  if budget == 0.0:
    np.testing.assert_array_equal(np.asarray(out.num_accepted), np.asarray(strict.num_accepted))
    np.testing.assert_array_equal(np.asarray(out.next_token), np.asarray(strict.next_token))


@FUZZ
@given(st.integers(1, 3), st.integers(1, 3), st.data(), st.booleans())
def test_draft_tree_builder_gives_well_formed_trees(depth, top_k, data, sample):
  pool = top_k + (depth - 1) * top_k ** 2
  shape = TreeShape(depth, top_k, data.draw(st.integers(1, pool)))
  b, v, capacity = 2, 9, 32
  seed = data.draw(st.integers(0, 2 ** 20))
  table = jax.random.normal(jax.random.key(seed), (v, v)) * data.draw(st.sampled_from([0.1, 4.]))
  root = table[jnp.arange(b)]

  def expand(front_tok, carry, positions, slots, visible):
    assert visible.shape == (b, top_k, capacity)
    return table[front_tok], None

  sampling = SamplingConfig(temperature=1.0) if sample else SamplingConfig()
  keys = jax.random.split(jax.random.key(seed + 1), depth)
  tokens, parents, depths, draft_logits = grow_dynamic_tree(
      root, expand, None, shape, sampling, keys, jnp.array([5, 9]), capacity)
  tokens, parents, depths = map(np.asarray, (tokens, parents, depths))
  nodes = pool if sample else shape.num_nodes
  assert tokens.shape == parents.shape == depths.shape == (b, nodes)
  assert ((0 <= tokens) & (tokens < v)).all()
  idx = np.arange(nodes)
  assert ((parents >= -1) & (parents < idx)).all()  # topological: parents come first
  parent_depth = np.where(parents < 0, 0, np.take_along_axis(depths, np.maximum(parents, 0), 1))
  np.testing.assert_array_equal(depths, parent_depth + 1)
  assert depths.max() <= depth
  if sample:
    assert draft_logits.shape == (b, nodes, v)
  else:
    assert draft_logits is None
    # Each kept node's children are distinct tokens (top-k of one distribution).
    for r in range(b):
      for p in set(parents[r].tolist()):
        kids = tokens[r, parents[r] == p]
        assert len(set(kids.tolist())) == len(kids)
