"""What a verification rule returns for one block (chain) or one draft tree.

Shapes: B batch rows, D tree depth (the rule's static `max_depth`).

Both types are NamedTuples, hence pytrees: they pass through `jit`, `vmap` and
`lax.while_loop` carries unchanged.
"""

from __future__ import annotations

from typing import NamedTuple

import jax

# `next_token` of a row whose logits were not finite. It is outside every vocabulary, so a
# decode loop that forgets to check `nonfinite` fails loudly at the embedding lookup's bounds
# check (or in tests) instead of silently committing a plausible token.
NONFINITE_TOKEN = -1


class VerifyOutput(NamedTuple):
  """Decision of a chain rule for each row.

  Attributes:
    num_accepted: int32[B] accepted draft tokens, in 0..K.
    next_token: int32[B] token committed after them: the recovery token, or the bonus token
      when all K were accepted. `NONFINITE_TOKEN` where `nonfinite`.
    spent: float32[B] regret ledger after this block (ASD); rules without a ledger return
      their input ledger (or zeros when they take none).
    num_exceptions: int32[B] accepted draft tokens that differ from the target argmax.
    nonfinite: bool[B] the row's target (or draft) logits held NaN, +inf, or a row with no
      finite entry. Such a row accepts nothing, commits `NONFINITE_TOKEN` and leaves its
      ledger unchanged. Isolated -inf entries (masked vocabulary) are fine.
  """

  num_accepted: jax.Array
  next_token: jax.Array
  spent: jax.Array
  num_exceptions: jax.Array
  nonfinite: jax.Array


class TreeVerifyOutput(NamedTuple):
  """Decision of a tree rule for each row; the same fields as `VerifyOutput` plus the path.

  Attributes:
    path: int32[B, D] accepted node indices from the root down, padded with -1; the first
      `num_accepted` entries are real nodes, each the parent of the next.
    num_accepted, next_token, spent, num_exceptions, nonfinite: as in `VerifyOutput`, with
      `num_accepted` in 0..D.
  """

  path: jax.Array
  num_accepted: jax.Array
  next_token: jax.Array
  spent: jax.Array
  num_exceptions: jax.Array
  nonfinite: jax.Array
