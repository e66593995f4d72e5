"""Verification of a draft tree: strict greedy and ASD.

Layout (the chain is the one-path tree parents = [-1, 0, 1, ..., K-2] with the same logits):
  tokens_BxN   int32 drafted token of each node
  parents_BxN  int32 parent node of each node; -1 = child of the root (the last committed
               token). Topological: parents[n] < n.
  logits_BxRxV target logits, R = N+1. Row 0 is the root's next-token distribution (it
               scores the root's children); row n+1 is the distribution after node n (it
               scores node n's children, and is the bonus row when node n ends the path).
Shapes: B batch rows, N tree nodes, R = N+1 logits rows, V vocabulary, D path length (static
`max_depth`, default N). Nodes deeper than D are outside the tree (an error on concrete
inputs; silently ignored under jit).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from asd_jax import verify_checks as checks
from asd_jax.asd_config import ASDConfig
from asd_jax.asd_verify import accept_prefix, config_scalars, draft_regret, settle_ledger
from asd_jax.greedy_verify import target_argmax
from asd_jax.verify_output import NONFINITE_TOKEN, TreeVerifyOutput


def tree_paths(parents_N, depth: int):
  """Root-to-node paths of one tree.

  Returns:
    path_NxD: node ids from the root down to node n, padded with -1.
    depth_N: 1-based depth of node n; 0 when it is deeper than D (outside the tree).
    leaf_N: node n is inside the tree and has no child inside it.
  """
  n = parents_N.shape[0]

  def up(cur_N, _):
    return jnp.where(cur_N >= 0, parents_N[jnp.maximum(cur_N, 0)], -1), cur_N

  # Unrolled: `depth` small integer steps, the same results, and no while loop in a decode
  # round, where on a GPU every loop step costs kernel launches and a read of its condition.
  beyond_N, anc_DxN = lax.scan(up, jnp.arange(n, dtype=jnp.int32), None, length=depth,
                               unroll=True)
  inside_N = beyond_N < 0
  depth_N = jnp.where(inside_N, jnp.sum(anc_DxN >= 0, axis=0, dtype=jnp.int32), 0)
  up_NxD = depth_N[:, None] - 1 - jnp.arange(depth, dtype=jnp.int32)
  path_NxD = jnp.where(up_NxD >= 0, anc_DxN[jnp.maximum(up_NxD, 0), jnp.arange(n)[:, None]], -1)
  # Slot 0 collects the root's children, slot n+1 node n's.
  has_child_N = jnp.zeros((n + 1,), bool).at[parents_N + 1].max(inside_N)[1:]
  return path_NxD, depth_N, inside_N & ~has_child_N


def _finish(path_D, accepted, end, best_R, spent, new_spent, exceptions, nonfinite):
  d = path_D.shape[0]
  path_D = jnp.where(jnp.arange(d) < accepted, path_D, -1)
  return TreeVerifyOutput(
      path=jnp.where(nonfinite, -1, path_D),
      num_accepted=jnp.where(nonfinite, 0, accepted),
      next_token=jnp.where(nonfinite, NONFINITE_TOKEN, best_R[end + 1]),
      spent=jnp.where(nonfinite, spent, new_spent),
      num_exceptions=jnp.where(nonfinite, 0, exceptions),
      nonfinite=nonfinite,
  )


def _node_checks(tokens_N, parents_N, logits_RxV, depth):
  best_R, top_R, nonfinite = target_argmax(logits_RxV)
  mismatch_N, regret_N = draft_regret(tokens_N, parents_N + 1, best_R, top_R, logits_RxV)
  path_NxD, depth_N, leaf_N = tree_paths(parents_N, depth)
  on_NxD = path_NxD >= 0
  at_NxD = jnp.maximum(path_NxD, 0)
  mismatch_NxD = on_NxD & mismatch_N[at_NxD]
  regret_NxD = jnp.where(on_NxD, regret_N[at_NxD], 0.0)
  return best_R, nonfinite, path_NxD, depth_N, leaf_N, mismatch_NxD, regret_NxD


def _tree_greedy_row(tokens_N, parents_N, logits_RxV, spent, depth):
  best_R, nonfinite, path_NxD, depth_N, _, mismatch_NxD, _ = _node_checks(
      tokens_N, parents_N, logits_RxV, depth)
  full_N = (depth_N > 0) & ~jnp.any(mismatch_NxD, axis=-1)
  # First maximum: among the deepest fully matched nodes, the lowest index.
  end = jnp.argmax(jnp.where(full_N, depth_N, 0)).astype(jnp.int32)
  accepted = jnp.where(full_N[end], depth_N[end], 0)
  end = jnp.where(accepted > 0, end, -1)
  return _finish(path_NxD[jnp.maximum(end, 0)], accepted, end, best_R, spent, spent,
                 jnp.int32(0), nonfinite)


def _tree_asd_row(tokens_N, parents_N, logits_RxV, spent, budget, gate, max_exceptions, depth,
                   normalize_q):
  best_R, nonfinite, path_NxD, depth_N, leaf_N, mismatch_NxD, regret_NxD = _node_checks(
      tokens_N, parents_N, logits_RxV, depth)
  # One proposal per root-to-leaf path, each with its own q_i = (path length) - i.
  n = tokens_N.shape[0]
  accepted_N, charge_N, exceptions_N = accept_prefix(
      mismatch_NxD, regret_NxD, depth_N, jnp.broadcast_to(budget - spent, (n,)), gate,
      max_exceptions, normalize_q)
  end_N = jnp.where(accepted_N > 0,
                    jnp.take_along_axis(path_NxD, jnp.maximum(accepted_N - 1, 0)[:, None],
                                        axis=1)[:, 0], -1)
  # Longest accepted prefix; ties: less regret, then the lowest end-node index (which is
  # strict greedy's choice when no mismatch is accepted).
  longest_N = leaf_N & (accepted_N == jnp.max(jnp.where(leaf_N, accepted_N, -1)))
  cheapest_N = longest_N & (charge_N == jnp.min(jnp.where(longest_N, charge_N, jnp.inf)))
  leaf = jnp.argmin(jnp.where(cheapest_N, end_N, n)).astype(jnp.int32)
  return _finish(path_NxD[leaf], accepted_N[leaf], end_N[leaf], best_R, spent,
                 settle_ledger(spent, charge_N[leaf], budget), exceptions_N[leaf], nonfinite)


@functools.partial(jax.jit, static_argnames=("depth",))
def _tree_greedy_core(tokens_BxN, parents_BxN, logits_BxRxV, spent_B, depth):
  row = functools.partial(_tree_greedy_row, depth=depth)
  return jax.vmap(row)(tokens_BxN, parents_BxN, logits_BxRxV, spent_B)


@functools.partial(jax.jit, static_argnames=("depth", "normalize_q"))
def _tree_asd_core(tokens_BxN, parents_BxN, logits_BxRxV, spent_B, budget, gate, max_exceptions,
                   depth, normalize_q):
  row = functools.partial(_tree_asd_row, budget=budget, gate=gate,
                          max_exceptions=max_exceptions, depth=depth, normalize_q=normalize_q)
  return jax.vmap(row)(tokens_BxN, parents_BxN, logits_BxRxV, spent_B)


def tree_asd_verify_traced(tokens_BxN, parents_BxN, logits_BxRxV, spent_B, budget, gate,
                           max_exceptions, *, depth: int, normalize_q: bool = False):
  """`tree_asd_verify` inside a jitted loop with traced budget/gate/max_exceptions scalars
  (one compiled program for every setting). No validation: check an ASDConfig first."""
  return _tree_asd_core(tokens_BxN, parents_BxN, logits_BxRxV, spent_B, budget, gate,
                        max_exceptions, depth=depth, normalize_q=normalize_q)


def tree_greedy_verify(tree_tokens, parents, target_logits, spent=None, *, max_depth=None,
                       check_values: bool = True) -> TreeVerifyOutput:
  """Strict greedy verification of a draft tree: the longest root path of exact matches.

  Args:
    tree_tokens: int[B, N]; parents: int[B, N]; target_logits: float[B, N+1, V] (module
      docstring for the layout).
    spent: optional float[B] ledger, passed through unchanged (zeros if None).
    max_depth: static path length D of the output (default N).
    check_values: check ids and parents on concrete inputs (skipped under jit).

  Returns:
    TreeVerifyOutput: the deepest node whose whole root path equals the target argmax (the
    lowest index among equally deep ones), its path, and next_token = argmax of the row after
    it (row 0 when nothing is accepted). On a chain it equals `greedy_verify`.
  """
  toks, par, z, vocab, depth = checks.tree(tree_tokens, parents, target_logits, max_depth,
                                           check_values)
  checks.token_range(toks, vocab, "tree_tokens", check_values)
  b = toks.shape[0]
  spent_B = jnp.zeros((b,), jnp.float32) if spent is None else checks.ledger(
      spent, b, check_values)
  return _tree_greedy_core(toks, par, z, spent_B, depth=depth)


def tree_asd_verify(tree_tokens, parents, target_logits, spent, config: ASDConfig, *,
                    max_depth=None, check_values: bool = True) -> TreeVerifyOutput:
  """ASD verification of a draft tree.

  The ASD mask of `asd_verify` is applied along every root-to-leaf path (with q_i counted on
  that path); the path with the longest accepted prefix wins (ties: less regret, then the
  lowest end-node index) and only its regret is charged to the ledger.

  Args: as `tree_greedy_verify`, plus the ledger `spent` float[B] and `config` (`ASDConfig`).

  Returns:
    TreeVerifyOutput with the guarantees of `asd_verify`; on a chain it equals `asd_verify`,
    and with budget 0 it equals `tree_greedy_verify`.
  """
  checks.config(config, ASDConfig)
  toks, par, z, vocab, depth = checks.tree(tree_tokens, parents, target_logits, max_depth,
                                           check_values)
  checks.token_range(toks, vocab, "tree_tokens", check_values)
  spent_B = checks.ledger(spent, toks.shape[0], check_values)
  return _tree_asd_core(toks, par, z, spent_B, *config_scalars(config), depth=depth,
                        normalize_q=config.normalize_q)
