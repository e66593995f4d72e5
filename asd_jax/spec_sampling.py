"""Lossless speculative sampling: chain rejection sampling and tree (multi-draft) sampling.

Chain: speculative sampling of Leviathan, Kalman & Matias (2023, "Fast Inference from
Transformers via Speculative Decoding") and Chen et al. (2023, "Accelerating Large Language
Model Decoding with Speculative Sampling"): accept x_i with probability min(1, p(x_i)/q(x_i));
at the first rejection sample from the residual norm(max(0, p - q)); after a full accept sample
the bonus token from the last target row.

Tree: recursive rejection sampling (RRS) for i.i.d. sibling candidates, as in SpecInfer (Miao
et al. 2024, "SpecInfer", multi-step speculative sampling, Thm. 4.2) and Multi-Candidate
Speculative Decoding (Yang et al. 2024, Alg. 1). At a node whose children were drawn i.i.d.
from the draft distribution q, the children are tried in index order against the current
target residual p: accept child x with probability min(1, p(x)/q(x)); after a rejection
p <- norm(max(0, p - q)) and the next child is tried; once a child is accepted its own
children are tried against the target distribution after it; when no child is left the next
token is drawn from the current p. Each step is a rejection sampler for the current p with an
independent proposal from q, so the committed tokens follow the target exactly. The guarantee
needs each node's children to be i.i.d. samples of `draft_logits` at that node (after the same
filters); deterministic top-k children make the scheme lossy.

Temperature, min-p, top-k and top-p are applied identically to the target and the draft logits
before the test: the output is distributed as the *filtered* target. Temperature 0 makes both
one-hot at their argmax, and the result is exactly strict greedy verification.

Shapes: B batch rows, K draft block length, N tree nodes, R logits rows (K+1 or N+1),
V vocabulary, D path length. Layouts as in greedy_verify.py (chain) and tree_verify.py (tree);
draft_logits row j is the draft distribution the token(s) at target row j were drawn from, so
a chain has K draft rows and a tree N (row 0 for the root's children, row n+1 for node n's;
the last node cannot have children).
"""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from asd_jax import verify_checks as checks
from asd_jax.greedy_verify import first_argmax, prefix_length, target_argmax
from asd_jax.sampling_keys import is_row_keys
from asd_jax.verify_output import NONFINITE_TOKEN, TreeVerifyOutput, VerifyOutput


def check_filters(temperature, top_k, top_p, min_p=0.0):
  """Validates sampling settings; returns them as (float, int, float, float). Raises
  ValueError."""
  if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not (
      math.isfinite(temperature) and temperature >= 0):
    raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
  if temperature > 0:
    check_float32_temperature(temperature)
  if isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 0:
    raise ValueError(f"top_k must be an int >= 0 (0 = off), got {top_k!r}")
  if isinstance(top_p, bool) or not isinstance(top_p, numbers.Real) or not 0 < top_p <= 1:
    raise ValueError(f"top_p must be in (0, 1] (1 = off), got {top_p!r}")
  if isinstance(min_p, bool) or not isinstance(min_p, numbers.Real) or not 0 <= min_p <= 1:
    raise ValueError(f"min_p must be in [0, 1] (0 = off), got {min_p!r}")
  return float(temperature), int(top_k), float(top_p), float(min_p)


_FLOAT32_TINY, _FLOAT32_MAX = float(np.finfo(np.float32).tiny), float(np.finfo(np.float32).max)


def check_float32_temperature(temperature: float) -> None:
  """Refuses T > 0 that float32 cannot divide by: below its smallest normal number T flushes
  to 0 (0/0 = NaN, then garbage tokens), above its largest it is inf (every token equally
  likely). Raises ValueError."""
  if not _FLOAT32_TINY <= temperature <= _FLOAT32_MAX:
    raise ValueError(f"temperature {temperature!r} is outside float32's normal range "
                     f"[{_FLOAT32_TINY:.3g}, {_FLOAT32_MAX:.3g}]; use 0 for greedy decoding")


@flax.struct.dataclass
class Filters:
  """Sampling filters as the rules compute with them. The values are pytree leaves, so inside
  a jitted decode loop they are traced and a new temperature, min-p, top-k or top-p reuses the
  compiled program; which filters run (greedy, min-p on, top-k on, top-p on) is static. Build
  one with `Filters.of` (checked) or SamplingConfig.filters().

  Per-row filters (`Filters.of_rows`, a batch whose requests sample differently, as a server's
  batch does): each value is [B], one per row, and a filter is on when any row uses it; a row
  that does not keeps its logits exactly as its own Filters would (min-p 0, top-k 0 and top-p 1
  select the unfiltered values), and a row at temperature 0 in a batch that samples gets the
  one-hot at its argmax, which every rule treats as greedy decoding.
  """

  temperature: Any  # float32 scalar or [B]; unused when greedy
  top_k: Any  # int32 scalar or [B]; unused when not use_top_k
  top_p: Any  # float32 scalar or [B]; unused when not use_top_p
  min_p: Any  # float32 scalar or [B]; unused when not use_min_p
  greedy: bool = flax.struct.field(pytree_node=False, default=False)  # every row greedy
  use_top_k: bool = flax.struct.field(pytree_node=False, default=False)
  use_top_p: bool = flax.struct.field(pytree_node=False, default=False)
  use_min_p: bool = flax.struct.field(pytree_node=False, default=False)
  # Per-row filters only: some rows greedy (temperature 0) and some not.
  some_greedy: bool = flax.struct.field(pytree_node=False, default=False)

  @classmethod
  def of(cls, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0) -> "Filters":
    temperature, top_k, top_p, min_p = check_filters(temperature, top_k, top_p, min_p)
    return cls(np.float32(temperature), np.int32(top_k), np.float32(top_p), np.float32(min_p),
               greedy=temperature == 0.0, use_top_k=top_k > 0, use_top_p=top_p < 1.0,
               use_min_p=min_p > 0.0)

  @classmethod
  def of_rows(cls, rows: list["Filters"]) -> "Filters":
    """One row's Filters each (built with `of`, so checked), as one per-row Filters."""
    if not rows:
      raise ValueError("per-row filters need at least one row")
    values = {name: np.stack([np.asarray(getattr(r, name)) for r in rows])
              for name in ("temperature", "top_k", "top_p", "min_p")}
    greedy = [r.greedy for r in rows]
    return cls(**values, greedy=all(greedy), some_greedy=any(greedy) and not all(greedy),
               **{flag: any(getattr(r, flag) for r in rows)
                  for flag in ("use_top_k", "use_top_p", "use_min_p")})


def scale_logits(z_xV, temperature: float):
  """(z - max z) / T in float32. Shifting first keeps a tiny T finite: the top logit maps to 0
  and the rest towards -inf, the argmax limit, where z / T alone would overflow to inf and
  softmax to NaN. The shift does not change the softmax."""
  z_xV = z_xV.astype(jnp.float32)
  return (z_xV - jnp.max(z_xV, axis=-1, keepdims=True)) / temperature


def _order_key(x):
  """uint32 keys that order like the float32 values (NaN aside)."""
  bits = lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _radix_select(keys_xV, weights_xV, need_x1):
  """Per row, the largest key t with sum(weights[keys >= t]) >= need, fixed bit by bit.

  32 masked reductions over V instead of a sort: on CPU at V = 49,152 a sort or lax.top_k
  costs more than the target forward this rule sits next to. Exact: t is one of the keys.
  """
  def fix_bit(i, t_x1):
    trial_x1 = t_x1 | lax.shift_left(jnp.uint32(1), (31 - i).astype(jnp.uint32))
    mass_x1 = jnp.sum(jnp.where(keys_xV >= trial_x1, weights_xV, 0.0), axis=-1, keepdims=True)
    return jnp.where(mass_x1 >= need_x1, trial_x1, t_x1)

  return lax.fori_loop(0, 32, fix_bit, jnp.zeros(keys_xV.shape[:-1] + (1,), jnp.uint32))


def _per_row(value, like_xV, dtype):
  """A filter value as it broadcasts against logits [..., V]: a scalar as it is, a per-row
  value [B] as [B, 1, ..., 1] (rows lead every logits array the rules and drafters filter)."""
  value = jnp.asarray(value, dtype)
  return value.reshape(value.shape + (1,) * (like_xV.ndim - value.ndim))


def filtered_probs(logits_xV, filters: Filters):
  """float32[..., V]: apply_sampling_filters for Filters (values traced or concrete; scalars,
  or one per row of the leading axis)."""
  vocab = logits_xV.shape[-1]
  z_xV = logits_xV.astype(jnp.float32)
  if filters.greedy:
    return jax.nn.one_hot(first_argmax(z_xV)[0], vocab, dtype=jnp.float32)
  temperature = _per_row(filters.temperature, z_xV, jnp.float32)
  if filters.some_greedy:  # those rows divide by 1 here and take their one-hot at the end
    greedy_x1 = temperature == 0
    argmax_xV = jax.nn.one_hot(first_argmax(z_xV)[0], vocab, dtype=jnp.float32)
    temperature = jnp.where(greedy_x1, 1.0, temperature)
  z_xV = scale_logits(z_xV, temperature)
  if filters.use_min_p:
    # min-p (vLLM's order: after temperature, before top-k/top-p): keep p >= min_p * max p.
    # scale_logits put the top logit at 0, so that is z >= log(min_p): no softmax, no sort.
    # (A row at min-p 0 compares with log 0 = -inf and keeps every logit.)
    z_xV = jnp.where(z_xV >= jnp.log(_per_row(filters.min_p, z_xV, jnp.float32)), z_xV,
                     -jnp.inf)
  if filters.use_top_k:
    # Keep every logit >= the k-th largest (ties at the boundary included). With k >= V no
    # threshold reaches k tokens' worth, the threshold stays at the lowest key: all are kept.
    # A row at k = 0 (per-row filters) keeps its logits.
    top_k = _per_row(filters.top_k, z_xV, jnp.float32)
    keys_xV = _order_key(z_xV)
    kth_x1 = _radix_select(keys_xV, jnp.ones_like(z_xV), top_k)
    z_xV = jnp.where((keys_xV >= kth_x1) | (top_k == 0), z_xV, -jnp.inf)
  p_xV = jax.nn.softmax(z_xV, axis=-1)
  if filters.use_top_p:
    # The smallest head whose mass reaches top_p: keep p >= the largest t with
    # mass(p >= t) >= top_p (so always at least the top token, and ties at the edge).
    # A row at top-p 1 (per-row filters) keeps its probabilities as they are.
    top_p = _per_row(filters.top_p, z_xV, jnp.float32)
    keys_xV = _order_key(p_xV)
    floor_x1 = _radix_select(keys_xV, p_xV, top_p)
    head_xV = jnp.where(keys_xV >= floor_x1, p_xV, 0.0)
    p_xV = jnp.where(top_p < 1, head_xV / jnp.sum(head_xV, axis=-1, keepdims=True), p_xV)
  if filters.some_greedy:
    p_xV = jnp.where(greedy_x1, argmax_xV, p_xV)
  return p_xV


def apply_sampling_filters(logits, temperature: float = 1.0, top_k: int = 0,
                           top_p: float = 1.0, min_p: float = 0.0):
  """Probabilities float32[..., V] after temperature, then min-p (tokens with probability
  below min_p times the top token's are dropped), then top-k, then top-p (nucleus).

  temperature 0 gives a one-hot at the argmax (first maximum). top_k = 0, top_p = 1 and
  min_p = 0 are off. Ties at the top-k or top-p boundary are all kept, so the support can
  exceed k. The settings are Python numbers, checked here; usable inside jit.
  """
  filters = Filters.of(temperature, top_k, top_p, min_p)
  logits = jnp.asarray(logits)
  if logits.ndim < 1 or logits.shape[-1] == 0:
    raise ValueError(f"logits must be [..., V] with V >= 1, got shape {tuple(logits.shape)}")
  return filtered_probs(logits, filters)


def _noise(key, batch: int, slots: int, vocab: int):
  # The chain and the tree draw the same noise, so a chain given as a tree samples the same.
  def draw(key, rows: tuple[int, ...]):
    k_accept, k_sample = jax.random.split(key)
    return (jax.random.uniform(k_accept, rows + (slots,)),
            jax.random.gumbel(k_sample, rows + (vocab,)))

  if is_row_keys(key):  # a key per row: row b's noise depends on key[b] only
    return jax.vmap(lambda k: draw(k, ()))(key)
  return draw(key, (batch,))


def _draw(dist_V, gumbel_V):
  return first_argmax(jnp.log(dist_V) + gumbel_V)[0]


def _residual(p_V, q_V):
  res_V = jnp.maximum(p_V - q_V, 0.0)
  total = jnp.sum(res_V, axis=-1, keepdims=True)
  # Zero mass means p <= q everywhere, where a rejection cannot happen; keep p.
  return jnp.where(total > 0, res_V / jnp.where(total > 0, total, 1.0), p_V)


def _nonfinite(target_logits, draft_logits):
  _, _, bad_target = target_argmax(target_logits)
  _, _, bad_draft = target_argmax(draft_logits)
  return bad_target | bad_draft


@functools.partial(jax.jit, static_argnames=("noise_slots",))
def chain_sample_core(draft_BxK, draft_logits_BxKxV, target_logits_BxRxV, key, draft_lengths_B,
                      filters: Filters, noise_slots: int) -> VerifyOutput:
  """`speculative_sample` without its checks, for a jitted loop holding traced filters."""
  b, k = draft_BxK.shape
  vocab = target_logits_BxRxV.shape[-1]
  p_BxRxV = filtered_probs(target_logits_BxRxV, filters)
  q_BxKxV = filtered_probs(draft_logits_BxKxV, filters)
  u_BxS, gumbel_BxV = _noise(key, b, noise_slots, vocab)
  u_BxK = u_BxS[:, :k]

  in_vocab_BxK = (draft_BxK >= 0) & (draft_BxK < vocab)
  own_BxK = jnp.arange(k) < draft_lengths_B[:, None]
  safe_BxKx1 = jnp.where(in_vocab_BxK, draft_BxK, 0)[..., None]
  px_BxK = jnp.take_along_axis(p_BxRxV[:, :k], safe_BxKx1, axis=-1)[..., 0]
  qx_BxK = jnp.take_along_axis(q_BxKxV, safe_BxKx1, axis=-1)[..., 0]
  accepted_B = prefix_length(own_BxK & in_vocab_BxK & (u_BxK * qx_BxK < px_BxK))

  at_Bx1x1 = accepted_B[:, None, None]
  p_BxV = jnp.take_along_axis(p_BxRxV, at_Bx1x1, axis=1)[:, 0]
  q_BxV = jnp.take_along_axis(q_BxKxV, jnp.minimum(at_Bx1x1, k - 1), axis=1)[:, 0]
  # A row that accepted its whole draft (all K, or all of its own shorter one) draws the next
  # token from the target itself, as after any full accept.
  full_Bx1 = (accepted_B == draft_lengths_B)[:, None]
  next_B = _draw(jnp.where(full_Bx1, p_BxV, _residual(p_BxV, q_BxV)), gumbel_BxV)

  best_BxR, _, _ = target_argmax(target_logits_BxRxV)
  off_argmax_BxK = (draft_BxK != best_BxR[:, :k]) & (jnp.arange(k) < accepted_B[:, None])
  nonfinite_B = _nonfinite(target_logits_BxRxV, draft_logits_BxKxV)
  return VerifyOutput(
      num_accepted=jnp.where(nonfinite_B, 0, accepted_B),
      next_token=jnp.where(nonfinite_B, NONFINITE_TOKEN, next_B),
      spent=jnp.zeros((b,), jnp.float32),
      num_exceptions=jnp.where(nonfinite_B, 0,
                               jnp.sum(off_argmax_BxK, axis=-1, dtype=jnp.int32)),
      nonfinite=nonfinite_B,
  )


def _tree_row(tokens_N, parents_N, p_RxV, q_NxV, best_R, u_N, gumbel_V, depth):
  n, vocab = q_NxV.shape
  q_RxV = jnp.concatenate([q_NxV, jnp.zeros_like(q_NxV[:1])], axis=0)
  in_vocab_N = (tokens_N >= 0) & (tokens_N < vocab)
  safe_N = jnp.where(in_vocab_N, tokens_N, 0)
  off_argmax_N = tokens_N != best_R[parents_N + 1]

  def visit(state, node):
    current, p_V, count, exceptions, path_D = state
    q_V = q_RxV[current + 1]
    tok = safe_N[node]
    candidate = (parents_N[node] == current) & (count < depth) & in_vocab_N[node]
    accept = candidate & (u_N[node] * q_V[tok] < p_V[tok])
    p_V = jnp.where(accept, p_RxV[node + 1],
                    jnp.where(candidate, _residual(p_V, q_V), p_V))
    path_D = jnp.where(accept, path_D.at[count].set(node), path_D)
    return (jnp.where(accept, node, current), p_V, count + accept,
            exceptions + (accept & off_argmax_N[node]), path_D), None

  init = (jnp.int32(-1), p_RxV[0], jnp.int32(0), jnp.int32(0),
          jnp.full((depth,), -1, jnp.int32))
  (_, p_V, count, exceptions, path_D), _ = lax.scan(visit, init,
                                                    jnp.arange(n, dtype=jnp.int32))
  return path_D, count, _draw(p_V, gumbel_V), exceptions


@functools.partial(jax.jit, static_argnames=("depth",))
def tree_sample_core(tokens_BxN, parents_BxN, draft_logits_BxNxV, target_logits_BxRxV, key,
                     filters: Filters, depth: int) -> TreeVerifyOutput:
  """`tree_speculative_sample` without its checks, for a jitted loop holding traced filters."""
  b, n = tokens_BxN.shape
  p_BxRxV = filtered_probs(target_logits_BxRxV, filters)
  q_BxNxV = filtered_probs(draft_logits_BxNxV, filters)
  u_BxN, gumbel_BxV = _noise(key, b, n, target_logits_BxRxV.shape[-1])
  best_BxR, _, _ = target_argmax(target_logits_BxRxV)
  row = functools.partial(_tree_row, depth=depth)
  path_BxD, accepted_B, next_B, exceptions_B = jax.vmap(row)(
      tokens_BxN, parents_BxN, p_BxRxV, q_BxNxV, best_BxR, u_BxN, gumbel_BxV)
  nonfinite_B = _nonfinite(target_logits_BxRxV, draft_logits_BxNxV)
  return TreeVerifyOutput(
      path=jnp.where(nonfinite_B[:, None], -1, path_BxD),
      num_accepted=jnp.where(nonfinite_B, 0, accepted_B),
      next_token=jnp.where(nonfinite_B, NONFINITE_TOKEN, next_B),
      spent=jnp.zeros((b,), jnp.float32),
      num_exceptions=jnp.where(nonfinite_B, 0, exceptions_B),
      nonfinite=nonfinite_B,
  )


def _check_key(key, batch: int):
  key = checks.as_array(key, "key")
  if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
    if key.ndim == 0 or tuple(key.shape) == (batch,):
      return key
  elif key.dtype == jnp.uint32 and key.ndim == 1:
    return key
  raise TypeError(f"key must be one PRNG key (jax.random.key or PRNGKey) or a key per row "
                  f"(jax.random.key array [{batch}]), got {key.dtype}{tuple(key.shape)}")


def speculative_sample(draft_tokens, draft_logits, target_logits, key, *,
                       temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                       min_p: float = 0.0, draft_lengths=None, noise_slots: int | None = None,
                       check_values: bool = True) -> VerifyOutput:
  """Lossless chain speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

  Args:
    draft_tokens: int[B, K], x_i drawn from the filtered draft_logits[:, i].
    draft_logits: float[B, K, V] the draft's logits for each position.
    target_logits: float[B, K+1, V] (row K is the bonus row).
    key: one PRNG key for the whole batch, or a typed key per row [B] (row b's draws then
      depend on key[b] only, as in the decode engines).
    temperature, top_k, top_p, min_p: filters applied to both distributions
      (`apply_sampling_filters`; traced: other values reuse the compiled program).
    draft_lengths: optional int[B] in [0, K]: row b's draft is its first draft_lengths[b]
      tokens; the rest are never accepted, and a row that accepts its whole draft samples the
      next token from the target (default: every row's draft is all K).
    noise_slots: static count (>= K) of acceptance uniforms drawn from the key, of which the
      first K are used (default K). With one value for every width, a row's result does not
      depend on how many positions past its own draft are scored: verifying any prefix of
      the block that covers draft_lengths gives the same verdict with the same key.
    check_values: check ids and draft_lengths on concrete inputs (skipped under jit).

  Returns:
    VerifyOutput: the committed x_{<a} + next_token are distributed exactly as the filtered
    target would sample them. spent is zeros (no ledger); num_exceptions counts accepted
    tokens that differ from the target argmax; nonfinite flags rows whose target or draft
    logits are not finite.
  """
  filters = Filters.of(temperature, top_k, top_p, min_p)
  draft, z, vocab = checks.block(draft_tokens, target_logits)
  b, k = draft.shape
  zq = checks.logits(draft_logits, "draft_logits", (b, k, vocab))
  checks.token_range(draft, vocab, "draft_tokens", check_values)
  lengths = checks.draft_lengths(draft_lengths, b, k, check_values)
  return chain_sample_core(draft, zq, z, _check_key(key, b), lengths, filters,
                           noise_slots=checks.noise_slots(noise_slots, k))


def sample_without_draft(target_logits_BxV, key, noise_slots: int, filters: Filters):
  """int32[B]: the token `speculative_sample` commits for a row whose draft is empty
  (draft_lengths 0), with the same key and noise_slots, from one target row alone: a decode
  round that verifies no position samples exactly what verifying a wider block would."""
  p_BxV = filtered_probs(target_logits_BxV, filters)
  _, gumbel_BxV = _noise(key, target_logits_BxV.shape[0], noise_slots,
                         target_logits_BxV.shape[-1])
  return _draw(p_BxV, gumbel_BxV)


def tree_speculative_sample(tree_tokens, parents, draft_logits, target_logits, key, *,
                            temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                            min_p: float = 0.0, max_depth=None,
                            check_values: bool = True) -> TreeVerifyOutput:
  """Lossless tree (multi-draft) speculative sampling by recursive rejection sampling.

  Args:
    tree_tokens: int[B, N]; parents: int[B, N] (layout of tree_verify.py); the children of
      each node must be i.i.d. draws from the filtered draft distribution at that node.
    draft_logits: float[B, N, V]; row 0 is the draft at the root, row n+1 after node n.
    target_logits: float[B, N+1, V]; row 0 at the root, row n+1 after node n.
    key, temperature, top_k, top_p, min_p, check_values: as `speculative_sample`.
    max_depth: static path length D of the output (default N).

  Returns:
    TreeVerifyOutput: the accepted path and next_token, distributed exactly as the filtered
    target would sample them. A chain given as a tree gives the same result as
    `speculative_sample` with the same key.
  """
  filters = Filters.of(temperature, top_k, top_p, min_p)
  toks, par, z, vocab, depth = checks.tree(tree_tokens, parents, target_logits, max_depth,
                                           check_values)
  b, n = toks.shape
  zq = checks.logits(draft_logits, "draft_logits", (b, n, vocab))
  checks.token_range(toks, vocab, "tree_tokens", check_values)
  return tree_sample_core(toks, par, zq, z, _check_key(key, b), filters, depth=depth)
