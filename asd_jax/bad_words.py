"""Bad words (vLLM's `bad_words`; transformers' `bad_words_ids`): token sequences an answer may
not hold. A sequence of one token is banned everywhere; a longer one has its last token banned
wherever the answer's tokens so far end with the rest of it, so the answer never completes it.
As vLLM does, only the answer's own tokens count, not the prompt's.

The engines apply it with the other logit edits (asd_jax/logit_edits.py): a logits row whose
context (the committed answer, plus the drafted tokens before it in a speculative round) ends
with a word's prefix gets -inf at the word's last token. So strict verification gives plain
decoding's output under the same bad words, and speculative sampling stays lossless.

Packed form (`pack`): prefix_NxW, each word but its last token, right-aligned, -1 where the word
is shorter than W (such a slot matches anything); last_N, each word's last token. N and W are
rounded up to powers of two (padding words ban nothing), so requests with a few more or fewer
words reuse the compiled program; the ids are traced values. The answer's last W tokens
(`TokenCounts.tail_BxW`, -1 where the answer is shorter) are what a prefix is matched against.

Shapes: B rows, R logits rows per row, J context tokens, N words, W prefix slots, V vocab.
"""

from __future__ import annotations

import numbers

import jax.numpy as jnp
import numpy as np

# vLLM's limits per request (MAX_NUM_BAD_WORDS, MAX_BAD_WORDS_TOTAL_TOKENS): the match costs
# B x R x N x W comparisons in every round.
MAX_WORDS = 128
MAX_TOKENS = 1024
NO_TOKEN = np.iinfo(np.int32).max  # a padding word's last token: past any vocabulary (dropped)


def check_bad_words_ids(words) -> tuple[tuple[int, ...], ...]:
  """Validates bad words as token sequences (a list of lists of ids >= 0, none empty); returns
  them without repeats, sorted. Raises ValueError. Ids are checked against the vocabulary where
  it is known (`pack`)."""
  if isinstance(words, (str, bytes, dict)) or not hasattr(words, "__iter__"):
    raise ValueError(f"bad_words_ids must be a list of token id lists, got {words!r}")
  seen = set()
  for word in words:
    if isinstance(word, (str, bytes, dict)) or not hasattr(word, "__iter__"):
      raise ValueError(f"bad_words_ids: each bad word is a list of token ids, got {word!r}")
    word = list(word)
    if not word:
      raise ValueError("bad_words_ids holds an empty word: it would ban nothing (drop it)")
    bad = [t for t in word
           if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0]
    if bad:
      raise ValueError(f"bad_words_ids: a token id must be an integer >= 0, got {bad[0]!r}")
    seen.add(tuple(map(int, word)))
  if len(seen) > MAX_WORDS:
    raise ValueError(f"bad_words_ids holds {len(seen)} token sequences; at most {MAX_WORDS}")
  total = sum(map(len, seen))
  if total > MAX_TOKENS:
    raise ValueError(f"bad_words_ids holds {total} tokens in all; at most {MAX_TOKENS}")
  return tuple(sorted(seen))


def _power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length() if n else 0


def pack(words: tuple[tuple[int, ...], ...], vocab_size: int):
  """(prefix_NxW, last_N) int32 arrays for checked words (see the module docstring); refuses an
  id outside [0, vocab_size)."""
  outside = [t for word in words for t in word if t >= vocab_size]
  if outside:
    raise ValueError(f"bad_words_ids names token id {outside[0]} outside the vocabulary "
                     f"[0, {vocab_size})")
  n = _power_of_two(len(words))
  w = _power_of_two(max(len(word) for word in words) - 1)
  prefix_NxW = np.full((n, w), -1, np.int32)
  last_N = np.full((n,), NO_TOKEN, np.int32)
  for i, word in enumerate(words):
    if len(word) > 1:
      prefix_NxW[i, w - len(word) + 1:] = word[:-1]
    last_N[i] = word[-1]
  return prefix_NxW, last_N


def pad_rows(rows):
  """One (prefix_NxW, last_N) or None per row as [B, N, W] and [B, N] (None for a row without
  bad words: all padding), the widest row's N and W."""
  n = max(last.shape[0] for _, last in filter(None, rows))
  w = max(prefix.shape[1] for prefix, _ in filter(None, rows))
  prefix_BxNxW = np.full((len(rows), n, w), -1, np.int32)
  last_BxN = np.full((len(rows), n), NO_TOKEN, np.int32)
  for b, row in enumerate(rows):
    if row is not None:
      prefix, last = row
      prefix_BxNxW[b, :prefix.shape[0], w - prefix.shape[1]:] = prefix
      last_BxN[b, :last.shape[0]] = last
  return prefix_BxNxW, last_BxN


def append_tail(tail_BxW, tokens_BxJ, keep_BxJ):
  """The last W tokens after appending tokens_BxJ[keep_BxJ] (keep_BxJ a prefix of each row,
  as every engine's commit is)."""
  w = tail_BxW.shape[-1]
  joined = jnp.concatenate([tail_BxW, tokens_BxJ.astype(jnp.int32)], axis=-1)
  kept = keep_BxJ.sum(axis=-1, dtype=jnp.int32)
  return jnp.take_along_axis(joined, kept[..., None] + jnp.arange(w), axis=-1)


def banned(b: int, r: int, vocab: int, tail_BxW, prefix, last, context_BxRxJ=None):
  """bool[B, R, V]: the tokens that would complete a bad word at each logits row. tail_BxW: the
  answers' last W tokens (None when W = 0); prefix / last: one request's [N, W] / [N] or one per
  row [B, N, W] / [B, N]; context_BxRxJ: each logits row's drafted tokens before it, -1 after
  them (None: none)."""
  prefix, last = jnp.asarray(prefix, jnp.int32), jnp.asarray(last, jnp.int32)
  if last.ndim == 1:
    prefix, last = prefix[None], last[None]
  n, w = prefix.shape[1:]
  if w:
    tail_BxRxW = jnp.broadcast_to(tail_BxW[:, None], (b, r, w))
    if context_BxRxJ is not None:
      tail_BxRxW = append_tail(tail_BxRxW, context_BxRxJ, context_BxRxJ >= 0)
    match_BxRxN = jnp.all((prefix[:, None] < 0) | (prefix[:, None] == tail_BxRxW[:, :, None]),
                          axis=-1)
  else:  # every word is one token: banned everywhere
    match_BxRxN = jnp.ones((1, r, n), bool)
  ids_BxRxN = jnp.broadcast_to(jnp.where(match_BxRxN, last[:, None], NO_TOKEN), (b, r, n))
  return jnp.zeros((b, r, vocab), bool).at[
      jnp.arange(b)[:, None, None], jnp.arange(r)[None, :, None], ids_BxRxN].set(
          True, mode="drop")
