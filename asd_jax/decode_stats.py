"""`DecodeStats`: what a speculative decode call did, per row, with one definition everywhere.

Shape notation: B rows, K draft block length.

tau (mean accepted length) = mean over verification rounds of (accepted draft tokens + 1):
tokens committed per target forward, counting the recovery/bonus token (the EAGLE, SGLang and
vLLM convention). Plain decoding has tau = 1. The batch value weights rows by their rounds.
Accepted drafts that are not output (past an EOS or max_new_tokens in a row's last round) do
not count in tau, accepted_B or accepted_per_position_BxK. That round still counts its +1 when
the row ended on one of its drafts, whose bonus token is not output either: a row's tau can
exceed (its tokens from rounds) / rounds by 1 / rounds (seen on SmolLM2: 12 new tokens, one
from the prefill, 8 rounds, tau 1.5 rather than 11/8). asd_exceptions_B and asd_spent_B are
the verifier's own account, which includes them: the ledger was charged when the block was
accepted, and the two describe the same decisions.
"""

from __future__ import annotations

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters accumulated over the rounds a row was active.

  rounds_B: verification rounds (target forwards after prefill).
  accepted_B: accepted draft tokens summed over rounds.
  accepted_per_position_BxK: rounds that accepted at least j+1 draft tokens, for each j.
  asd_exceptions_B: accepted draft tokens that differ from the target argmax: ASD's
    mismatches under rule 'asd'; under 'sample', the accepted tokens that were not the
    target's argmax (speculative sampling accepts them by design, losslessly).
  asd_spent_B: the request's regret ledger at the end (never spent past the budget; 0 under
    'strict' and 'sample').
  """

  rounds_B: jax.Array
  accepted_B: jax.Array
  accepted_per_position_BxK: jax.Array
  asd_exceptions_B: jax.Array
  asd_spent_B: jax.Array

  def tau_per_row(self) -> np.ndarray:
    """A row without verification rounds (max_new_tokens 1: its token came from the prefill)
    has tau 1, as plain decoding does."""
    rounds = np.asarray(self.rounds_B, np.float64)
    return np.where(rounds > 0, (np.asarray(self.accepted_B) + rounds) / np.maximum(rounds, 1),
                    1.0)

  def summary(self) -> dict:
    """JSON-ready aggregate over rows (tau weighted by rounds)."""
    rounds = np.asarray(self.rounds_B, np.int64)
    accepted = np.asarray(self.accepted_B, np.int64)
    total_rounds = int(rounds.sum())
    per_pos = np.asarray(self.accepted_per_position_BxK, np.int64).sum(axis=0)
    return {
        "rounds": total_rounds,
        "tau": float((accepted.sum() + total_rounds) / total_rounds) if total_rounds else 1.0,
        "tau_per_row": [round(float(t), 4) for t in self.tau_per_row()],
        "acceptance_rate": float(accepted.sum() / max(total_rounds * per_pos.shape[0], 1)),
        "accepted_per_position": [float(c / max(total_rounds, 1)) for c in per_pos],
        "asd_exceptions": np.asarray(self.asd_exceptions_B).astype(int).tolist(),
        "asd_spent": [round(float(s), 6) for s in np.asarray(self.asd_spent_B)],
    }
