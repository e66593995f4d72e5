"""`DecodeStats`: what a speculative decode call did, per row, with one definition everywhere.

Shape notation: B rows, K draft block length.

tau (mean accepted length) = tokens a row's verification rounds output / its rounds: the
accepted drafts plus the recovery/bonus token of each round, i.e. tokens committed per target
forward (the EAGLE, SGLang and vLLM convention; the prefill's token is not a round's). Plain
decoding has tau = 1. The batch value weights rows by their rounds. A row's last round may
accept drafts past an EOS, a stop string or max_new_tokens; those are not output and count in
neither tau, accepted_B nor accepted_per_position_BxK, and when the row ends on one of the
round's drafts the round's own bonus token is not output and not counted either (before
2026-12-07 it was: tau read up to 1 / rounds high, e.g. 12 new tokens on SmolLM2, one from the
prefill, 8 rounds: 1.5 rather than 11/8). A round whose target logits are not finite outputs
nothing and ends the row; it was a target forward, so it counts as a round. asd_exceptions_B
and asd_spent_B are the verifier's own account, which includes them: the ledger was charged
when the block was accepted, and the two describe the same decisions.
"""

from __future__ import annotations

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class DecodeStats:
  """Per-row counters accumulated over the rounds a row was active.

  rounds_B: verification rounds (target forwards after prefill).
  round_tokens_B: tokens the rounds output (accepted drafts and bonus tokens): a row's
    num_generated less the prefill's token.
  accepted_B: accepted draft tokens summed over rounds.
  accepted_per_position_BxK: rounds that accepted at least j+1 draft tokens, for each j.
  asd_exceptions_B: accepted draft tokens that differ from the target argmax: ASD's
    mismatches under rule 'asd'; under 'sample', the accepted tokens that were not the
    target's argmax (speculative sampling accepts them by design, losslessly).
  asd_spent_B: the request's regret ledger at the end (never spent past the budget; 0 under
    'strict' and 'sample').
  """

  rounds_B: jax.Array
  round_tokens_B: jax.Array
  accepted_B: jax.Array
  accepted_per_position_BxK: jax.Array
  asd_exceptions_B: jax.Array
  asd_spent_B: jax.Array

  def tau_per_row(self) -> np.ndarray:
    """A row without verification rounds (max_new_tokens 1: its token came from the prefill)
    has tau 1, as plain decoding does."""
    rounds = np.asarray(self.rounds_B, np.float64)
    return np.where(rounds > 0, np.asarray(self.round_tokens_B) / np.maximum(rounds, 1), 1.0)

  def summary(self) -> dict:
    """JSON-ready aggregate over rows (tau weighted by rounds)."""
    rounds = np.asarray(self.rounds_B, np.int64)
    accepted = np.asarray(self.accepted_B, np.int64)
    round_tokens = int(np.asarray(self.round_tokens_B, np.int64).sum())
    total_rounds = int(rounds.sum())
    per_pos = np.asarray(self.accepted_per_position_BxK, np.int64).sum(axis=0)
    return {
        "rounds": total_rounds,
        "tau": round_tokens / total_rounds if total_rounds else 1.0,
        "tau_per_row": [round(float(t), 4) for t in self.tau_per_row()],
        "acceptance_rate": float(accepted.sum() / max(total_rounds * per_pos.shape[0], 1)),
        "accepted_per_position": [float(c / max(total_rounds, 1)) for c in per_pos],
        "asd_exceptions": np.asarray(self.asd_exceptions_B).astype(int).tolist(),
        "asd_spent": [round(float(s), 6) for s in np.asarray(self.asd_spent_B)],
    }
