"""A model-free chain drafter: n-gram lookup in the request's own tokens (prompt lookup).

The draft is what followed the most recent earlier occurrence of the row's last n tokens,
trying n = max_ngram first and down to min_ngram (the idea of vLLM's `ngram` speculator and
transformers' `prompt_lookup_num_tokens`). It costs no model forward, so every accepted token
is nearly free; it pays off where outputs copy from the prompt or repeat themselves (code
edits, summaries, extraction, and the loops small models fall into) and costs a verify of
K+1 positions where nothing matches.

A match ending at position j predicts the continuation j+1, j+2, ... and, when that runs into
the row's newest token, continues periodically with period L-1-j (L committed tokens): the
suffix repeats what followed the match, so a repeating output is drafted block after block.
With no match the row drafts its last token K times (any guess is safe; the target verifies)
and reports a draft length of 0 (`draft_length`): a round in which no row has a match costs
one plain decoding step instead of a K+1-token verification. With an n-gram store
(`ngram+store`, asd_jax/ngram_store.py) such a row first tries text the target wrote for other
prompts; a stored match of n tokens reports a length of n - 1 (at most K), because stored
continuations are accepted far less often than the row's own: on the target's greedy answers
to all of HumanEval, 0.47 / 0.60 / 1.35 tokens per round (K = 7) after a stored match of
2 / 3 / 4 tokens against 1.9-3.9 after a match in the row's own tokens, and each verified
position costs ~0.1 of a plain step on a 2-core CPU (scripts/simulate_ngram_widths.py;
measured: +6% tokens/s at K = 5, +11% at K = 7, same outputs).

State: the row's committed tokens by position [B, capacity]. Positions the engine never passes
(accepted draft tokens between rounds, see drafter_api) are filled by writing each draft at
its positions: under every rule an accepted position commits the draft token.

Shape notation: B rows, T prompt width, C capacity (cache slots), K draft block length, V vocab.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from asd_jax.drafter_api import DRAFTERS_KEPT, ChainDrafter
from asd_jax.ngram_store import NgramStore, store_draft
from asd_jax.request_checks import check_positive_int, param_shapes
from asd_jax.spec_sampling import Filters

# The draft distribution of a deterministic proposal is one-hot. Rejection sampling divides by
# q, so the other tokens get a large finite negative logit (not -inf: the sampling rule treats
# non-finite drafter logits as a broken drafter and stops the row).
_OFF_LOGIT = -1e9

# The lookup compares the history once per n-gram size, unrolled at trace time, every round:
# its compile time and round cost grow with max_ngram. Prompt lookup uses 2-5 (vLLM's default
# upper bound is 5); 32 leaves room without letting a typo compile for minutes.
MAX_NGRAM = 32


def lookup_draft(history_BxC: jax.Array, length_B: jax.Array, num_draft: int,
                 max_ngram: int, min_ngram: int) -> tuple[jax.Array, jax.Array]:
  """(int32[B, K] draft, bool[B] found): the n-gram continuation of each row's first length_B
  tokens (see module); found is False where no n-gram of min_ngram or more tokens matched."""
  b, c = history_BxC.shape
  j_C = jnp.arange(c)
  rows_Bx1 = jnp.arange(b)[:, None]
  suffix_pos_BxN = jnp.maximum(length_B[:, None] - 1 - jnp.arange(max_ngram)[None], 0)
  suffix_BxN = history_BxC[rows_Bx1, suffix_pos_BxN]  # newest first
  # A match ends at j <= L-2, so at least its next token is committed.
  can_end_BxC = j_C[None] <= (length_B[:, None] - 2)
  matched_BxC = jnp.ones((b, c), bool)
  best_B = jnp.full((b,), -1, jnp.int32)
  for m in range(max_ngram):  # m-th newest suffix token vs the token m before each end j
    shifted_BxC = jnp.pad(history_BxC, ((0, 0), (m, 0)))[:, :c]
    matched_BxC = matched_BxC & (shifted_BxC == suffix_BxN[:, m:m + 1]) & (j_C[None] >= m)
    n = m + 1
    if n >= min_ngram:
      # Longer n-grams first, then the most recent end: one score orders both.
      score_BxC = jnp.where(matched_BxC & can_end_BxC, n * c + j_C[None], -1)
      best_B = jnp.maximum(best_B, score_BxC.max(axis=1))
  found_B = best_B >= 0
  end_B = jnp.where(found_B, best_B % c, 0)
  period_B = jnp.maximum(length_B - 1 - end_B, 1)
  i_K = jnp.arange(num_draft)
  source_BxK = end_B[:, None] + 1 + i_K[None] % period_B[:, None]
  source_BxK = jnp.where(found_B[:, None], source_BxK, (length_B - 1)[:, None])
  return history_BxC[rows_Bx1, source_BxK], found_B


def ngram_drafter(num_draft: int, vocab_size: int, *, max_ngram: int = 3,
                  min_ngram: int = 2, store: NgramStore | None = None) -> ChainDrafter:
  """A ChainDrafter proposing K tokens by n-gram lookup. Its params are None, or with `store`
  (asd_jax.ngram_store) the store's tables (drafter_params=store.tables): a row whose own
  tokens hold no match drafts the stored continuation of its longest stored suffix instead.

  A row without a match of at least min_ngram tokens has no draft worth verifying
  (`draft_length` 0); when no row in the batch has one, the engine runs a plain decoding step,
  and with a store a round whose rows only have stored matches verifies fewer tokens. The
  default 2 is measured on a 2-core CPU, where verifying 4 tokens costs ~1.4 plain steps and a
  one-token match is accepted for only ~0.36 tokens per round; on an accelerator, where a
  verification costs about one step, min_ngram=1 drafts more often and pays.

  Built once per settings and store: calling it again returns the same drafter, so the decode
  loop compiled for it is reused (asd_jax.drafter_api.DRAFTERS_KEPT).
  """
  k = check_positive_int("K (draft block length)", num_draft)
  vocab_size = check_positive_int("vocab_size", vocab_size)
  min_ngram, max_ngram = check_ngram_sizes(min_ngram, max_ngram)
  if store is not None and store.vocab_size != vocab_size:
    raise ValueError(f"the n-gram store was built for a vocabulary of {store.vocab_size} "
                     f"tokens, the target has {vocab_size}")
  return _ngram_drafter(k, vocab_size, min_ngram, max_ngram, store)


@functools.lru_cache(maxsize=DRAFTERS_KEPT)  # one drafter per settings and store object
def _ngram_drafter(k: int, vocab_size: int, min_ngram: int, max_ngram: int,
                   store: NgramStore | None) -> ChainDrafter:
  # Without a store every draft is all or nothing; with one, the lengths a stored match of
  # min_n..max_n tokens asks for (n - 1 each, below K) are widths of their own.
  widths = () if store is None else tuple(
      sorted({n - 1 for n in range(store.min_n, store.max_n + 1) if 0 < n - 1 < k}))

  def prefill(params, prompt_BxT, lengths_B, capacity):
    del params, lengths_B  # pads past a row's length are overwritten before they are read
    b, t = prompt_BxT.shape
    history_BxC = jnp.zeros((b, capacity), jnp.int32).at[:, :t].set(
        prompt_BxT.astype(jnp.int32))
    return history_BxC, jnp.zeros((b,), jnp.int32)

  def propose(params, state, recent_Bx2, positions_Bx2, rng, sampling: Filters):
    del rng
    history_BxC, _ = state
    rows_Bx1 = jnp.arange(history_BxC.shape[0])[:, None]
    history_BxC = history_BxC.at[rows_Bx1, positions_Bx2].set(recent_Bx2, mode="drop")
    length_B = positions_Bx2[:, 1] + 1
    draft_BxK, found_B = lookup_draft(history_BxC, length_B, k, max_ngram, min_ngram)
    draft_length_B = jnp.where(found_B, k, 0)
    if store is not None:  # params are the store's tables: the fallback for rows without a match
      stored_BxK, matched_n_B = store_draft(params, history_BxC, length_B, k)
      draft_BxK = jnp.where(found_B[:, None], draft_BxK, stored_BxK)
      draft_length_B = jnp.where(found_B, k, jnp.clip(matched_n_B - 1, 0, k))
    history_BxC = history_BxC.at[rows_Bx1, length_B[:, None] + jnp.arange(k)[None]].set(
        draft_BxK, mode="drop")
    draft_logits = None
    if not sampling.greedy:
      draft_logits = jnp.where(jax.nn.one_hot(draft_BxK, vocab_size, dtype=bool), 0.0,
                               _OFF_LOGIT).astype(jnp.float32)
    return draft_BxK, draft_logits, (history_BxC, draft_length_B.astype(jnp.int32))

  return ChainDrafter(prefill=prefill, propose=propose, num_draft=k,
                      vocab_size=int(vocab_size),
                      name=f"ngram{min_ngram}-{max_ngram}" + ("+store" if store else ""),
                      draft_length=lambda state: state[1], verify_widths=widths,
                      param_shapes=None if store is None else param_shapes(store.tables))


STORE_SUFFIX = "+store"


def uses_store(name: str) -> bool:
  """'ngram+store' / 'ngram:MIN-MAX+store': the target's shipped n-gram store as fallback."""
  return parse_ngram_name(name) is not None and name.endswith(STORE_SUFFIX)


def parse_ngram_name(name: str) -> tuple[int, int] | None:
  """'ngram' -> (2, 3); 'ngram:4' -> (2, 4); 'ngram:1-4' -> (1, 4) (each also with '+store');
  other names -> None."""
  name = name[:-len(STORE_SUFFIX)] if name.endswith(STORE_SUFFIX) else name
  if name != "ngram" and not name.startswith("ngram:"):
    return None
  if name == "ngram":
    return 2, 3
  spec = name.split(":", 1)[1]
  try:
    lo, hi = spec.split("-", 1) if "-" in spec else (None, spec)
    hi = int(hi)
    lo = min(2, hi) if lo is None else int(lo)
  except ValueError:
    raise ValueError(f"bad n-gram drafter name {name!r}; use 'ngram', 'ngram:MAX' or "
                     f"'ngram:MIN-MAX' (n-gram sizes), optionally with '+store'") from None
  try:
    return check_ngram_sizes(lo, hi)
  except ValueError as e:
    raise ValueError(f"bad n-gram drafter name {name!r}: {e}") from None


def check_ngram_sizes(min_ngram, max_ngram) -> tuple[int, int]:
  """(min_ngram, max_ngram) as ints with 1 <= min <= max <= MAX_NGRAM, else ValueError."""
  max_ngram = check_positive_int("max_ngram", max_ngram)
  min_ngram = check_positive_int("min_ngram", min_ngram)
  if min_ngram > max_ngram:
    raise ValueError(f"min_ngram ({min_ngram}) must be <= max_ngram ({max_ngram})")
  if max_ngram > MAX_NGRAM:
    raise ValueError(f"max_ngram {max_ngram} is above {MAX_NGRAM}: the lookup runs once per "
                     f"n-gram size every round (prompt lookup uses 2-5)")
  return min_ngram, max_ngram
