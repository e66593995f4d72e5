"""Timing the real decode loops with a drafter that costs nothing.

`token0_drafter` always proposes token 0, so a chain round commits one token and costs the
verification of K + 1 tokens plus the loop's bookkeeping. `loop_runs` builds a plain decode
and one such round loop per K on a fixed request (180 random prompt ids, capacity 448);
asd_jax.cli_common.time_interleaved times them in turns. Used by scripts/time_decode_loop.py,
scripts/simulate_ngram_widths.py (the width cost table) and scripts/profile_round.py.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.drafter_api import ChainDrafter
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode

PROMPT_LENGTH, CAPACITY = 180, 448


def token0_drafter(k: int, vocab_size: int, draft_length=None,
                   name: str | None = None) -> ChainDrafter:
  """Proposes K zeros every round; `draft_length` as ChainDrafter's (None: always K)."""
  def propose(params, state, recent_Bx2, positions_Bx2, key, sampling):
    return jnp.zeros((recent_Bx2.shape[0], k), jnp.int32), None, state
  return ChainDrafter(prefill=lambda *a: jnp.zeros((), jnp.int32), propose=propose,
                      num_draft=k, vocab_size=vocab_size, name=name or f"zeros{k}",
                      draft_length=draft_length)


def loop_runs(fns, params, ks, new_tokens: int = 96) -> dict[int, Callable[[], jax.Array]]:
  """{0: plain decoding, K: chain decoding with token0_drafter(K)} on the fixed request; each
  call returns the generated ids."""
  prompt = np.zeros((1, 192), np.int32)
  prompt[0, :PROMPT_LENGTH] = np.random.RandomState(0).randint(100, 5000, PROMPT_LENGTH)
  lengths = np.array([PROMPT_LENGTH], np.int32)
  runs = {0: lambda: plain_decode(fns, params, prompt, lengths, max_new_tokens=new_tokens,
                                  capacity=CAPACITY).tokens_BxN}
  for k in ks:
    runs[k] = lambda d=token0_drafter(k, fns.vocab_size): asd_decode(
        fns, params, d, None, prompt, lengths, max_new_tokens=new_tokens,
        capacity=CAPACITY).tokens_BxN
  return runs
