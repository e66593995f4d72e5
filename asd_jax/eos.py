"""The ids that end an answer (EOS, and a request's stop token ids): one set for every row of a
decode call, or one set per row (a server's batch, where one request ignores EOS and another
stops at its own ids, as vLLM's per-request ignore_eos and stop_token_ids).

The engines compile for the union of the rows' ids (a static tuple, as one set was) and take
which of them ends each row as a traced mask (request_checks.check_row_eos_ids builds both),
so rows with other sets reuse the program.

Shape notation: B rows, E ids in the union.
"""

from __future__ import annotations

import jax.numpy as jnp


def is_eos(tokens, eos_ids: tuple[int, ...], eos_rows_BxE=None):
  """bool, the shape of tokens ([B] or [B, J]): the token ends its row (False without ids)."""
  if not eos_ids:
    return jnp.zeros(jnp.shape(tokens), bool)
  hits = jnp.asarray(tokens)[..., None] == jnp.asarray(eos_ids, jnp.int32)
  if eos_rows_BxE is not None:
    mask = jnp.asarray(eos_rows_BxE)
    hits = hits & mask.reshape(mask.shape[:1] + (1,) * (hits.ndim - 2) + mask.shape[1:])
  return hits.any(axis=-1)
