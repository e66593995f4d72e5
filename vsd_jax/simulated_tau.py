"""Simulated tau on held-out target text: replays strict greedy speculative decoding.

tau has the `asd_jax.decode_stats.DecodeStats` definition: the tokens the verification rounds
output / the rounds, rounds pooled over rows. Because the data is the target's own
greedy continuation, a draft token is accepted exactly when it equals the next data token,
and the drafter's state on an accepted prefix is its teacher-forced state on the data; so
per-position ranks (vsd_jax/objective_api.py) determine every round:

  the prompt's prefill commits the first response token c; a round with last committed token
  at c drafts from row p = c - 1; step j proposes the token at c + 1 + j; chain: accept the
  leading steps whose rank is 0 (top-1 == data), up to K; tree: the leading steps whose data
  token is among the drafter's top-k at that depth (a dynamic tree that expands the top-k of
  every node on the accepted path; an upper bound for trees with a node budget). The target
  then adds one token; c advances by accepted + 1. Rounds stop at the end of the response: a
  round whose drafts reach its last token outputs no token of its own (as real decoding stops
  at the EOS or at max_new_tokens; counting it made tau up to 1 / rounds high per row until
  2026-12-07).
"""

from __future__ import annotations

import numpy as np


def simulate_rounds(ranks_BxTxK: np.ndarray, loss_mask_BxT: np.ndarray, length_B: np.ndarray,
                    depth: int, top_k: int = 1) -> tuple[int, int, int, np.ndarray]:
  """(rounds, tokens the rounds output, accepted draft tokens, per-depth counts of rounds
  accepting >= j+1) over rows."""
  ranks = np.asarray(ranks_BxTxK)
  if depth > ranks.shape[-1]:
    raise ValueError(f"depth {depth} exceeds the {ranks.shape[-1]} simulated draft steps")
  rounds = round_tokens = accepted = 0
  per_depth = np.zeros(depth, np.int64)
  for b in range(ranks.shape[0]):
    resp = np.flatnonzero(np.asarray(loss_mask_BxT[b][:length_B[b]]) > 0)
    if len(resp) < 2:
      continue
    c, end = int(resp[0]), int(length_B[b])
    ok = ranks[b] < top_k  # [T, K]
    while c < end - 1:
      p, a = c - 1, 0
      while a < depth and c + 1 + a < end and ok[p, a]:
        a += 1
      rounds, accepted = rounds + 1, accepted + a
      round_tokens += min(a + 1, end - 1 - c)
      per_depth[:a] += 1
      c += a + 1
  return rounds, round_tokens, accepted, per_depth


def simulated_tau(ranks_BxTxK, loss_mask_BxT, length_B, depth: int, top_k: int = 1) -> dict:
  """JSON-ready tau, acceptance rate and per-position acceptance (DecodeStats.summary names)."""
  rounds, round_tokens, accepted, per_depth = simulate_rounds(ranks_BxTxK, loss_mask_BxT,
                                                              length_B, depth, top_k)
  return {"tau": round_tokens / rounds if rounds else 1.0, "rounds": rounds,
          "acceptance_rate": accepted / max(rounds * depth, 1),
          "accepted_per_position": [float(c / max(rounds, 1)) for c in per_depth]}
