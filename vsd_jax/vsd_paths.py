"""VSD's E-step and M-step arithmetic on draft paths (specs/vsd.md), as pure array functions.

Shapes: `...` are leading batch axes (rows x sampled context positions), S draft paths per
position, d depths.
  paths   int32 [..., S, d]  draft ids proposed by the drafter (vsd_jax/draft_paths.py)
  oracle  int32 [..., d]     the target's greedy continuation as draft ids (or [..., S, d]: one
                             per path, the target's greedy token after each path prefix, from
                             vsd_jax/target_oracle.py), with two sentinels:
                             UNKNOWN (-1): past the end of the data, nothing to compare with;
                             NOT_DRAFTABLE (-2): a target token outside the draft vocabulary
                             (the drafter cannot propose it, so every path is rejected there).

Greedy acceptance (T = 0): alpha_j = 1[z_j == oracle_j]; a path's accepted length l is the
number of leading alpha_j = 1, and its corrected path is z_0..z_{l-1} followed by oracle_l (the
target's corrective token). Because the accepted prefix equals the oracle's, every corrected
path is the oracle's own prefix of length l + 1: with target-regenerated greedy data the
E-step needs no target forward at all (`vsd_oracle=data`), and the M-step's log-likelihoods
are the drafter's scores of data tokens along its own draft states (EAGLE-3's
training-time-test states). Other data needs the target's verdict on every path prefix
(`vsd_oracle=target`, one tree-masked target forward).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

UNKNOWN = -1
NOT_DRAFTABLE = -2


def per_path(oracle, paths):
  """The oracle as [..., S, d] (a shared [..., d] oracle is broadcast over the S paths)."""
  return oracle if oracle.ndim == paths.ndim else jnp.broadcast_to(oracle[..., None, :],
                                                                    paths.shape)


def accepted_length(paths, oracle):
  """int32 [..., S]: leading draft tokens equal to the oracle's (sentinels never match)."""
  oracle = per_path(oracle, paths)
  match = (paths == oracle) & (oracle >= 0)
  return jnp.cumprod(match.astype(jnp.int32), axis=-1).sum(-1)


def corrected_paths(paths, oracle):
  """(tokens int32 [..., S, d], keep bool [..., S, d], accepted length int32 [..., S]).

  tokens: the accepted prefix, then the oracle token at the first rejected depth (the rest is
  the oracle too, but `keep` is False there: the path stops after its correction, spec step 3
  without the optional continuation; see `continued_keep` for it). A sentinel oracle token
  cannot be a training label, so `keep` is also False at a correction that lands on UNKNOWN or
  NOT_DRAFTABLE.
  """
  length = accepted_length(paths, oracle)
  depth = jnp.arange(paths.shape[-1])
  tokens = jnp.where(depth < length[..., None], paths, per_path(oracle, paths))
  keep = (depth <= length[..., None]) & (tokens >= 0)
  return tokens, keep, length


def continued_keep(oracle):
  """bool [..., d]: spec step 3 with its optional continuation, for a shared oracle [..., d].

  Continuing a corrected path with the target's greedy path to depth d makes every path's
  corrected path the whole oracle o_0..o_{d-1}: its accepted prefix already is the oracle's
  (greedy acceptance). The path's labels are then the oracle's tokens up to its first
  sentinel (an unknown or undraftable token ends the path: nothing to label there, and the
  drafter could not have proposed it), scored along the oracle's own chain of drafter states,
  not the draft path's (past the correction the two prefixes differ).
  """
  return jnp.cumprod((oracle >= 0).astype(jnp.int32), axis=-1) > 0


def rejected_tokens(paths, oracle, length):
  """(draft id int32 [..., S], is_rejected bool [..., S]) of each path's first rejected token.

  A path is rejected at depth l = its accepted length when l < d and the oracle there is
  known (a NOT_DRAFTABLE oracle rejects any draft token; UNKNOWN decides nothing).
  """
  d = paths.shape[-1]
  at = jnp.minimum(length, d - 1)
  token = jnp.take_along_axis(paths, at[..., None], axis=-1)[..., 0]
  oracle_at = jnp.take_along_axis(per_path(oracle, paths), at[..., None], axis=-1)[..., 0]
  return token, (length < d) & (oracle_at != UNKNOWN)


def expected_accepted_length(logp_target, logq_draft):
  """float32 [..., S]: sum_j prod_{i <= j} alpha_i with alpha_i = min(1, p(z_i) / q(z_i)).

  Spec step 4's `utility=expected`: the expected number of a path's tokens that speculative
  sampling (temperature 1) accepts, from the target's and the drafter's probabilities of the
  path's own tokens after its own prefix (both [..., S, d], natural logs). With a one-hot
  target (T = 0) it is the accepted length.
  """
  alpha = jnp.exp(jnp.minimum(logp_target - logq_draft, 0.0))
  return jnp.cumprod(alpha, axis=-1).sum(-1)


def path_weights(utility, valid, eta: float = 1.0):
  """w_s = softmax_s(eta * U_s) over the valid paths (float32 [..., S]; all zero if none)."""
  logits = jnp.where(valid, eta * utility.astype(jnp.float32), -jnp.inf)
  any_valid = valid.any(-1, keepdims=True)
  w = jax.nn.softmax(jnp.where(any_valid, logits, 0.0), axis=-1)
  return jnp.where(valid & any_valid, w, 0.0)


def arw_weights(weights, confidence, valid):
  """ARW: w~_s = w_s - c * mean_s(w_s) over the valid paths, c = confidence [...] in [0, 1].

  The caller passes c = sg(conf_psi(x)); c = 0 gives the plain weights back.
  """
  n = jnp.maximum(valid.sum(-1, keepdims=True), 1).astype(jnp.float32)
  baseline = weights.sum(-1, keepdims=True) / n
  return jnp.where(valid, weights - confidence[..., None] * baseline, 0.0)


def weighted_path_nll(logq_corrected, keep, weights):
  """L_WL per position [...]: - sum_s w~_s * sum_j log q(z~_j | x, z~_<j) over kept tokens."""
  per_path = jnp.where(keep, logq_corrected, 0.0).sum(-1)
  return -(weights * per_path).sum(-1)


def car_penalty(q_rejected, is_rejected, gamma: float = 0.5):
  """L_CAR per position [...]: sum_s 1[q > gamma] * q * (-log(1 - q)) over rejected tokens.

  q_rejected: the drafter's probability of each path's first rejected token (gradients flow
  through both factors). Zero when no rejected token is above gamma.
  """
  q = jnp.clip(q_rejected, 0.0, 1.0 - 1e-6)  # -log(1 - q) is finite for q < 1
  hard = is_rejected & (q_rejected > gamma)
  return jnp.where(hard, q * -jnp.log1p(-q), 0.0).sum(-1)
