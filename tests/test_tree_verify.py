"""Tree verification: strict greedy and ASD over root-to-leaf paths.

Shapes: B rows, N nodes, V vocabulary, D path length. Logits on a 0.5 grid (exact ties and
exact float32 sums).
"""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import importlib

tree_verify_module = importlib.import_module("asd_jax.tree_verify")
from asd_jax.asd_config import EXPLORATORY, PAPER, STRICT, ASDConfig
from asd_jax.asd_verify import asd_verify
from asd_jax.greedy_verify import greedy_verify
from asd_jax.tree_verify import tree_asd_verify, tree_greedy_verify
from asd_jax.verify_output import NONFINITE_TOKEN

SHAPES = [(1, 1, 2), (3, 6, 4), (2, 9, 3)]
EXAMPLES = settings(max_examples=40, deadline=None)

configs = st.builds(
    ASDConfig,
    budget=st.sampled_from([0.0, 0.5, 1.0, 3.0, 8.0]),
    gate=st.sampled_from([0.0, 0.25, 0.5, 10.0]),
    max_exceptions=st.integers(0, 3),
    normalize_q=st.booleans(),
)


@st.composite
def trees(draw, chain=False):
  b, n, v = draw(st.sampled_from(SHAPES))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  levels = draw(st.sampled_from([2, 3, 8]))
  p_match = draw(st.sampled_from([0.3, 0.7, 1.0]))
  if chain:
    parents = np.tile(np.arange(-1, n - 1), (b, 1))
  else:
    parents = np.stack([[rng.integers(-1, i) for i in range(n)] for _ in range(b)])
  z = (rng.integers(0, levels, (b, n + 1, v)) * 0.5).astype(np.float32)
  best = np.take_along_axis(z.argmax(-1), parents + 1, 1)
  tokens = np.where(rng.random((b, n)) < p_match, best, rng.integers(0, v, (b, n)))
  return tokens.astype(np.int32), parents.astype(np.int32), z


def root_path(parents, node):
  path = []
  while node >= 0:
    path.append(node)
    node = parents[node]
  return path[::-1]


def accept_along(z, tokens, parents, path, spent, cfg):
  """specs/asd.md literally, along one path; returns (a, charge, exceptions)."""
  f32, k = np.float32, len(path)
  rem = f32(cfg.budget) - f32(spent)
  charged, count, a = f32(0), 0, 0
  for i, node in enumerate(path):
    zi, x = z[parents[node] + 1], tokens[node]
    m = x != zi.argmax()
    r = max(f32(0), zi.max() - zi[x])
    q = f32(k - i) / f32(k) if cfg.normalize_q else f32(k - i)
    c_i, n_i = charged + (r if m else f32(0)), count + int(m)
    if not ((not m or r / q <= f32(cfg.gate)) and (not m or (c_i - r < rem and c_i <= rem))
            and n_i <= cfg.max_exceptions):
      break
    charged, count, a = c_i, n_i, a + 1
  return a, charged, count


def reference_tree(tokens, parents, z, spent, cfg, depth):
  """Brute force over nodes (strict when cfg is None) or root-to-leaf paths (ASD)."""
  out = {k: [] for k in ("path", "num_accepted", "next_token", "spent", "num_exceptions",
                         "nonfinite")}
  for row in range(tokens.shape[0]):
    tok, par, zr = tokens[row], parents[row], z[row]
    n = len(tok)
    if not np.all(np.isfinite(zr.max(-1))):
      values = ([-1] * depth, 0, NONFINITE_TOKEN, spent[row], 0, True)
    else:
      paths = [root_path(par, i) for i in range(n)]
      if cfg is None:
        full = [all(tok[j] == zr[par[j] + 1].argmax() for j in p) for p in paths]
        best = max(range(n), key=lambda i: (full[i] * len(paths[i]), -i))
        chosen = paths[best] if full[best] else []
        charge, count = np.float32(0), 0
      else:
        leaves = [i for i in range(n) if i not in set(par)]
        results = []
        for leaf in leaves:
          a, c, e = accept_along(zr, tok, par, paths[leaf], spent[row], cfg)
          end = paths[leaf][a - 1] if a else -1
          results.append(((-a, c, end), paths[leaf][:a], c, e))
        _, chosen, charge, count = min(results, key=lambda t: t[0])
      end = chosen[-1] if chosen else -1
      values = (chosen + [-1] * (depth - len(chosen)), len(chosen), zr[end + 1].argmax(),
                spent[row] + charge, count, False)
    for k, v in zip(out, values):
      out[k].append(v)
  return {k: np.asarray(v) for k, v in out.items()}


def assert_fields(out, want, names=None):
  for name in names or want:
    np.testing.assert_array_equal(np.asarray(getattr(out, name)), np.asarray(want[name]),
                                  err_msg=name)


def hand_tree():
  """V=6. Root children: node 0 (match) and node 1 (costly mismatch).
  Under node 0: node 2 (cheap mismatch, r=0.25) -> node 4 (match) -> node 5 (match),
  and node 3 (match, a leaf)."""
  tokens = np.array([[1, 2, 3, 4, 5, 0]], np.int32)
  parents = np.array([[-1, -1, 0, 0, 2, 4]], np.int32)
  z = np.zeros((1, 7, 6), np.float32)
  z[0, 0, 1], z[0, 0, 2] = 3.0, -5.0       # root row: y* = 1; node 1 (id 2) has r = 8
  z[0, 1, 4], z[0, 1, 3] = 2.0, 1.75       # after node 0: y* = 4; node 2 (id 3) r = 0.25
  z[0, 3, 5] = 1.0                         # after node 2: y* = 5 = node 4
  z[0, 4, 1] = 1.0                         # after node 3: y* = 1 (strict's next token)
  z[0, 5, 0] = 1.0                         # after node 4: y* = 0 = node 5
  z[0, 6, 3] = 1.0                         # after node 5: bonus y* = 3
  return tokens, parents, z


def test_hand_worked_tree():
  tokens, parents, z = hand_tree()
  strict = tree_greedy_verify(tokens, parents, z)
  assert_fields(strict, dict(path=[[0, 3, -1, -1, -1, -1]], num_accepted=[2], next_token=[1],
                             spent=[0.0], num_exceptions=[0]))
  out = tree_asd_verify(tokens, parents, z, np.zeros(1), PAPER)
  # Leaf 5's path has length 4: r/q at its position 1 is 0.25/3 <= 0.25.
  assert_fields(out, dict(path=[[0, 2, 4, 5, -1, -1]], num_accepted=[4], next_token=[3],
                          spent=[0.25], num_exceptions=[1]))
  short = tree_asd_verify(tokens, parents, z, np.zeros(1), PAPER, max_depth=4)
  np.testing.assert_array_equal(np.asarray(short.path), [[0, 2, 4, 5]])


def test_ties_go_to_less_regret_and_only_the_chosen_path_is_charged():
  # Two root branches, both one cheap mismatch then a match: regrets 0.5 and 0.25.
  tokens = np.array([[2, 0, 3, 0]], np.int32)
  parents = np.array([[-1, 0, -1, 2]], np.int32)
  z = np.zeros((1, 5, 4), np.float32)
  z[0, 0, 1], z[0, 0, 2], z[0, 0, 3] = 2.0, 1.5, 1.75
  z[0, 1, 0] = z[0, 3, 0] = 1.0
  out = tree_asd_verify(tokens, parents, z, np.zeros(1), PAPER)
  assert_fields(out, dict(path=[[2, 3, -1, -1]], num_accepted=[2], spent=[0.25],
                          num_exceptions=[1]))


@EXAMPLES
@given(trees(chain=True), configs)
def test_chain_as_tree_equals_chain(tree, cfg):
  tokens, parents, z = tree
  spent = np.zeros(tokens.shape[0], np.float32)
  for chain_out, tree_out in ((greedy_verify(tokens, z, spent),
                               tree_greedy_verify(tokens, parents, z, spent)),
                              (asd_verify(tokens, z, spent, cfg),
                               tree_asd_verify(tokens, parents, z, spent, cfg))):
    for name in chain_out._fields:
      np.testing.assert_array_equal(np.asarray(getattr(tree_out, name)),
                                    np.asarray(getattr(chain_out, name)), err_msg=name)
    a = np.asarray(tree_out.num_accepted)
    np.testing.assert_array_equal(np.asarray(tree_out.path),
                                  np.where(np.arange(tokens.shape[1]) < a[:, None],
                                           np.arange(tokens.shape[1]), -1))


@EXAMPLES
@given(trees(), st.sampled_from([0.0, 0.5, 10.0]), st.integers(0, 3), st.booleans())
def test_budget_zero_tree_is_strict(tree, gate, cap, normalize_q):
  tokens, parents, z = tree
  spent = np.zeros(tokens.shape[0], np.float32)
  strict = tree_greedy_verify(tokens, parents, z, spent)
  for cfg in (ASDConfig(0.0, gate, cap, normalize_q), ASDConfig(3.0, gate, 0, normalize_q)):
    out = tree_asd_verify(tokens, parents, z, spent, cfg)
    for name in strict._fields:
      np.testing.assert_array_equal(np.asarray(getattr(out, name)),
                                    np.asarray(getattr(strict, name)), err_msg=name)


@EXAMPLES
@given(st.data())
def test_tree_matches_brute_force(data):
  tokens, parents, z = data.draw(trees())
  cfg = data.draw(configs)
  spent = np.asarray(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]),
                                        min_size=len(tokens), max_size=len(tokens))),
                     np.float32) * np.float32(cfg.budget)
  n = tokens.shape[1]
  assert_fields(tree_greedy_verify(tokens, parents, z, spent),
                reference_tree(tokens, parents, z, spent, None, n))
  out = tree_asd_verify(tokens, parents, z, spent, cfg)
  assert_fields(out, reference_tree(tokens, parents, z, spent, cfg, n))
  # Path well formed: each node's parent is the previous one; spent within budget.
  path, a = np.asarray(out.path), np.asarray(out.num_accepted)
  for row in range(len(tokens)):
    prev = -1
    for node in path[row, :a[row]]:
      assert parents[row, node] == prev
      prev = node
  assert np.all(np.asarray(out.spent) <= np.float32(cfg.budget))
  assert np.all(a >= np.asarray(tree_greedy_verify(tokens, parents, z).num_accepted))


def test_nodes_deeper_than_max_depth():
  tokens, parents, z = hand_tree()
  with pytest.raises(ValueError, match="levels deep"):
    tree_greedy_verify(tokens, parents, z, max_depth=3)
  # Under jit the depth cannot be checked: nodes below max_depth are outside the tree, so the
  # result is that of the tree without node 5.
  out = jax.jit(lambda t, p, zz: tree_asd_verify(t, p, zz, jnp.zeros(1), PAPER, max_depth=3))(
      tokens, parents, z)
  assert_fields(out, dict(path=[[0, 2, 4]], num_accepted=[3], next_token=[0], spent=[0.25]))


def test_tree_nonfinite_rows_are_flagged():
  tokens, parents, z = hand_tree()
  tokens, parents, z = (np.repeat(a, 2, 0) for a in (tokens, parents, z))
  z[1, 6, 2] = np.nan   # the bonus row of the ASD path
  out = tree_asd_verify(tokens, parents, z, np.array([1.0, 1.0]), PAPER)
  assert_fields(out, dict(path=[[0, 2, 4, 5, -1, -1], [-1] * 6], num_accepted=[4, 0],
                          next_token=[3, NONFINITE_TOKEN], spent=[1.25, 1.0],
                          num_exceptions=[1, 0], nonfinite=[False, True]))
  strict = tree_greedy_verify(tokens, parents, z)
  np.testing.assert_array_equal(np.asarray(strict.nonfinite), [False, True])


def test_tree_same_shapes_never_retrace(monkeypatch):
  chex.clear_trace_counter()
  core = tree_verify_module._tree_asd_core.__wrapped__
  monkeypatch.setattr(tree_verify_module, "_tree_asd_core", jax.jit(
      chex.assert_max_traces(core, n=1), static_argnames=("depth", "normalize_q")))
  tokens, parents, z = hand_tree()
  for cfg in (PAPER, EXPLORATORY, STRICT, ASDConfig(0.5, 3, 1)):
    tree_asd_verify(tokens, parents, z + np.float32(cfg.budget), np.zeros(1), cfg)
