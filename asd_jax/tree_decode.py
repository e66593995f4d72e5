"""`asd_tree_decode`: speculative decoding with draft trees (one target forward per tree).

Each round the tree drafter proposes N nodes (asd_jax/draft_tree.py); the target scores the
last committed token plus all N nodes in one forward with a tree attention mask, writing node
n's K/V to scratch slot n_committed + n at position n_committed - 1 + depth(n); the rule
(strict, ASD, lossless sampling) picks a root path; the accepted path's K/V entries are then
moved into consecutive slots, so the cache again holds exactly the committed sequence with
slot == position, and the next round is indistinguishable from a chain round.

Shape notation: B rows, N tree nodes, D depth, V vocab, S cache slots.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp

from asd_jax.asd_config import PAPER, ASDConfig
from asd_jax.decode_rounds import (RoundState, SpecDecodeResult, commit_round, finish,
                                   initial_state)
from asd_jax.draft_tree import TreeDrafter
from asd_jax import logit_edits
from asd_jax.lm_api import LanguageModelFns, check_logits
from asd_jax.logit_edits import LogitEdits
from asd_jax.plain_decode import DECODE_LOOP_COMPILER_OPTIONS
from asd_jax.request_checks import check_type
from asd_jax.sampling import SamplingConfig, sampling_for_rows
from asd_jax.sampling_keys import split_keys
from asd_jax.spec_decode import prepare_request, run_loop
from asd_jax.spec_sampling import Filters, tree_sample_core
from asd_jax.host_calls import HostCall
from asd_jax.stop_strings import StopArg
from asd_jax import token_logprobs
from asd_jax.token_stream import TokenStream
from asd_jax.tree_verify import tree_asd_verify_traced, tree_greedy_verify, tree_paths


def tree_attention(parents_BxN, committed_B, capacity: int, depth: int):
  """Slots, positions offsets and visibility of the verification forward over [root, nodes].

  Returns (slots_BxT, depth_BxT, visible_BxTxS, paths_BxNxD) with T = N + 1: token 0 is the
  last committed token (slot n-1), node i sits in slot n + i; each sees the committed prefix,
  the root and its own ancestors (itself included), which paths_BxNxD lists (tree_paths).
  """
  paths_BxNxD, depth_BxN, _ = jax.vmap(lambda p: tree_paths(p, depth))(parents_BxN)
  n_B = committed_B
  b, n_nodes = parents_BxN.shape
  slots_BxT = jnp.concatenate([(n_B - 1)[:, None], n_B[:, None] + jnp.arange(n_nodes)], axis=1)
  anc_slots_BxNxD = jnp.where(paths_BxNxD >= 0, n_B[:, None, None] + paths_BxNxD, -1)
  s_S = jnp.arange(capacity)
  committed_BxS = s_S[None] < n_B[:, None]  # the root (slot n-1) included
  nodes_visible = committed_BxS[:, None, :] | (
      s_S[None, None, :, None] == anc_slots_BxNxD[:, :, None, :]).any(-1)
  visible_BxTxS = jnp.concatenate([committed_BxS[:, None, :], nodes_visible], axis=1)
  depth_BxT = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), depth_BxN], axis=1)
  return slots_BxT, depth_BxT, visible_BxTxS, paths_BxNxD


def _flat_features(hidden_BxTxNxD, feature_layers):
  """[B, T, N*D] target features; the target must return exactly the drafter's layers."""
  if hidden_BxTxNxD is None or hidden_BxTxNxD.shape[2] != len(feature_layers):
    got = None if hidden_BxTxNxD is None else hidden_BxTxNxD.shape
    raise ValueError(f"the drafter reads target layers {feature_layers}, but the target "
                     f"returns hidden states of shape {got}; build the target's functions "
                     f"with hidden_layers={feature_layers}")
  b, t, n, d = hidden_BxTxNxD.shape
  return hidden_BxTxNxD.reshape(b, t, n * d)


def _verify_tree(rule, tokens, parents, draft_logits, target_logits, spent_B, asd_scalars, key,
                 sampling: Filters, normalize_q: bool, depth: int):
  if rule == "strict":
    return tree_greedy_verify(tokens, parents, target_logits, spent_B, max_depth=depth,
                              check_values=False)
  if rule == "asd":
    return tree_asd_verify_traced(tokens, parents, target_logits, spent_B, *asd_scalars,
                                  depth=depth, normalize_q=normalize_q)
  out = tree_sample_core(tokens, parents, draft_logits, target_logits, key, sampling,
                         depth=depth)
  return out._replace(spent=spent_B)


@functools.partial(jax.jit, static_argnames=(
    "target", "drafter", "rule", "normalize_q", "max_new_tokens", "capacity", "eos_ids",
    "logprobs", "top_logprobs"), compiler_options=DECODE_LOOP_COMPILER_OPTIONS)
def _tree_decode(target: LanguageModelFns, target_params, drafter: TreeDrafter, drafter_params,
                 prompt_BxT, lengths_B, max_new_B, asd_scalars, rng, *, rule: str,
                 sampling: Filters, edits: LogitEdits, normalize_q: bool,
                 max_new_tokens: int, capacity: int, eos_ids: tuple[int, ...], host: HostCall,
                 logprobs: bool, top_logprobs: int,
                 eos_rows_BxE=None) -> SpecDecodeResult:
  b = prompt_BxT.shape[0]
  # A path of N nodes is at most N deep (the verifiers refuse a larger max_depth): a greedy tree
  # keeps num_nodes, which --tree 4,4,2 makes fewer than its depth; a sampled one keeps the
  # whole pool, never shallower than the tree.
  shape = drafter.shape
  depth = min(shape.depth, shape.num_nodes) if sampling.greedy else shape.depth
  window = shape.window
  target_cache = target.init_cache(b, capacity)
  first_logits_BxV, hidden, target_cache = target.prefill(target_params, prompt_BxT, lengths_B,
                                                          target_cache)
  check_logits(target, first_logits_BxV, (b, target.vocab_size), "prefill")
  features_BxSxF = None
  if drafter.feature_layers:
    prompt_features = _flat_features(hidden, drafter.feature_layers)
    features_BxSxF = jnp.zeros((b, capacity, prompt_features.shape[-1]), prompt_features.dtype)
    features_BxSxF = features_BxSxF.at[:, :prompt_BxT.shape[1]].set(prompt_features)
  drafter_state = drafter.prefill(drafter_params, prompt_BxT, lengths_B, capacity,
                                  None if features_BxSxF is None else prompt_features)
  drafter_state = (drafter_state, features_BxSxF)
  state = initial_state(prompt_BxT, lengths_B, max_new_B, first_logits_BxV, rng, sampling,
                        eos_ids, max_new_tokens=max_new_tokens, depth=depth,
                        target_cache=target_cache, drafter_state=drafter_state,
                        history_width=capacity, host=host, logprobs=logprobs,
                        top_logprobs=top_logprobs, edits=edits, eos_rows_BxE=eos_rows_BxE)

  def cond(s: RoundState):
    return ~jnp.all(s.done_B) & (s.round < max_new_tokens)

  def body(s: RoundState):
    rng, k_draft, k_verify = split_keys(s.rng, 3)
    n_B = s.committed_B
    # Positions below 0 (short prompts) re-feed position 0: the same token, the same entry.
    window_pos_BxW = jnp.maximum(n_B[:, None] - window + jnp.arange(window), 0)
    window_BxW = jnp.take_along_axis(s.history_BxS, window_pos_BxW, axis=1)
    drafter_state, features_BxSxF = s.drafter_state
    window_features = None
    if features_BxSxF is not None:
      window_features = jnp.take_along_axis(features_BxSxF, window_pos_BxW[:, :, None], axis=1)
    draft_edits = {}
    if drafter.takes_logit_edits and edits.on:
      draft_edits["edits"] = logit_edits.DraftLogitEdits(s.token_counts, edits)
    tokens_BxN, parents_BxN, node_depth_BxN, draft_logits, drafter_state = drafter.propose(
        drafter_params, drafter_state, window_BxW, window_pos_BxW, n_B, k_draft, sampling,
        capacity, window_features, **draft_edits)

    slots_BxT, depth_BxT, visible_BxTxS, paths_BxNxD = tree_attention(parents_BxN, n_B,
                                                                      capacity, depth)
    root_B = s.recent_Bx2[:, 1]
    block_BxT = jnp.concatenate([root_B[:, None], tokens_BxN], axis=1)
    positions_BxT = (n_B - 1)[:, None] + depth_BxT
    target_logits, hidden, target_cache = target.tree_forward(
        target_params, block_BxT, positions_BxT, slots_BxT, visible_BxTxS, s.target_cache)
    check_logits(target, target_logits, block_BxT.shape + (target.vocab_size,), "tree_forward")
    verify_logits = target_logits
    if edits.on:  # row n+1 judges node n's children in the context of node n's path
      verify_logits = logit_edits.edit_logits(target_logits, s.token_counts, edits,
                                              logit_edits.tree_context(tokens_BxN, paths_BxNxD))
    verdict = _verify_tree(rule, tokens_BxN, parents_BxN, draft_logits, verify_logits,
                           s.stats.asd_spent_B, asd_scalars, k_verify, sampling, normalize_q,
                           depth)
    # Compact: node path[i] (slot n + path[i]) moves to slot n + i for i < accepted.
    d_D = jnp.arange(depth)
    on_path_BxD = d_D[None] < verdict.num_accepted[:, None]
    src_BxD = n_B[:, None] + jnp.maximum(verdict.path, 0)
    dst_BxD = jnp.where(on_path_BxD & ~s.done_B[:, None], n_B[:, None] + d_D, capacity)
    target_cache = target.move_slots(target_cache, src_BxD, dst_BxD)
    path_tokens_BxD = jnp.where(on_path_BxD, jnp.take_along_axis(
        tokens_BxN, jnp.maximum(verdict.path, 0), axis=1), 0)
    # Block rows of the root and the accepted path: row i's logits predict committed token i.
    rows_BxD1 = jnp.concatenate([jnp.zeros((b, 1), jnp.int32), 1 + jnp.maximum(
        verdict.path, 0)], axis=1)
    lp_BxD1 = None
    if logprobs:
      lp_BxD1 = token_logprobs.block_logprobs(
          jnp.take_along_axis(target_logits, rows_BxD1[:, :, None], axis=1), path_tokens_BxD,
          verdict.num_accepted, verdict.next_token, top_logprobs)
    if features_BxSxF is not None:
      # Keep the target's features of what was committed: the root (position n-1) and the
      # accepted path (positions n..n+a-1); the recovery/bonus token has none yet.
      new_BxTxF = _flat_features(hidden, drafter.feature_layers)
      keep_BxD1 = jnp.concatenate([~s.done_B[:, None], on_path_BxD & ~s.done_B[:, None]], axis=1)
      pos_BxD1 = jnp.where(keep_BxD1, (n_B - 1)[:, None] + jnp.arange(depth + 1), capacity)
      features_BxSxF = features_BxSxF.at[jnp.arange(b)[:, None], pos_BxD1].set(
          jnp.take_along_axis(new_BxTxF, rows_BxD1[:, :, None], axis=1), mode="drop")
    s = s.replace(round=s.round + 1, target_cache=target_cache,
                  drafter_state=(drafter_state, features_BxSxF), rng=rng)
    return commit_round(s, path_tokens_BxD, verdict, max_new_B, eos_ids, host, lp_BxD1,
                        eos_rows_BxE=eos_rows_BxE, edits=edits)

  state = jax.lax.while_loop(cond, body, state)
  return finish(state, max_new_tokens)


def asd_tree_decode(target: LanguageModelFns, target_params, drafter: TreeDrafter,
                    drafter_params, prompt_BxT, lengths_B, *, max_new_tokens: int,
                    rule: str = "strict",
                    asd_config: ASDConfig = PAPER,
                    sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
                    eos_ids=(), seed: int = 0,
                    max_new_B=None, capacity: int | None = None,
                    stream: TokenStream | None = None,
                    stop: StopArg = None, logprobs: bool = False,
                    top_logprobs: int = 0) -> SpecDecodeResult:
  """Tree speculative decoding; the same contract and guarantees as `asd_decode`.

  strict (and asd at budget 0) give exactly the target's greedy output (in bfloat16, up to
  near-ties, as asd_decode); sample is lossless
  when the drafter draws children i.i.d. (lm_tree_drafter does under sampling). DecodeStats'
  per-position acceptance is per tree depth.
  """
  if not isinstance(drafter, TreeDrafter):
    raise TypeError(f"drafter must be a TreeDrafter, got {type(drafter).__name__}")
  check_type("target", target, LanguageModelFns)
  sampling = sampling_for_rows(sampling)  # read below, before prepare_request
  if target.tree_forward is None or target.move_slots is None:
    raise ValueError(f"target {target.name!r} has no tree_forward/move_slots; it cannot verify "
                     "trees")
  shape = drafter.shape
  lookahead = max(shape.num_nodes if sampling.greedy else shape.pool_size,
                  (shape.depth - 1) * shape.top_k) + 1
  req = prepare_request(target, drafter.vocab_size, prompt_BxT, lengths_B, rule=rule,
                        asd_config=asd_config, sampling=sampling, eos_ids=eos_ids,
                        max_new_tokens=max_new_tokens, max_new_B=max_new_B, capacity=capacity,
                        lookahead=lookahead, what=f"tree {shape}", seed=seed,
                        drafter_window=(drafter.name, drafter.max_positions))
  return run_loop(_tree_decode, target, target_params, drafter, drafter_params, req,
                  sampling=sampling, normalize_q=asd_config.normalize_q, stream=stream,
                  stop=stop, logprobs=logprobs, top_logprobs=top_logprobs)
