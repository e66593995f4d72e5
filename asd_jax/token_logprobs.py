"""Log-probabilities of the output tokens under the target (the engines' `logprobs=True`), and
with `top_logprobs=L` the L tokens the target found most likely at each output position.

Each output token's log p under the target's own distribution at that position: the raw logits'
log-softmax, before temperature, top-k or top-p (vLLM's raw logprobs). Speculative engines read
them from the verify forward that scored the token, so they cost no extra forward: a token the
target accepted from the draft is scored where the target saw it, and an ASD exception (a
mismatch accepted under the budget) shows as a token the target found unlikely. With greedy
strict decoding every token is the target's argmax, so it is also the first of the top L.

Shape notation: B rows, J positions, V vocab, L = top_logprobs.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from asd_jax import request_checks


@flax.struct.dataclass
class TokenLogprobs:
  """Per output position: the committed token's log p (`chosen`), and with top_logprobs = L > 0
  the L most likely token ids and their log p, most likely first (None when L = 0). The decode
  loops carry one as a buffer beside their token buffer."""

  chosen_BxJ: jax.Array
  top_ids_BxJxL: jax.Array | None = None
  top_BxJxL: jax.Array | None = None


def check_logprobs_request(logprobs, top_logprobs, vocab_size: int) -> None:
  """Refuses a wrong type, a negative L, an L past the vocabulary, or top logprobs without
  logprobs (the top L sit beside each token's own log p; asking for them alone is a typo)."""
  request_checks.check_type("logprobs", logprobs, bool)
  if isinstance(top_logprobs, bool) or not isinstance(top_logprobs, int):
    raise TypeError(f"top_logprobs must be int, got {type(top_logprobs).__name__}")
  if top_logprobs < 0:
    raise ValueError(f"top_logprobs must be >= 0, got {top_logprobs}")
  if top_logprobs > vocab_size:
    raise ValueError(f"top_logprobs {top_logprobs} is more than the vocabulary's {vocab_size} "
                     "tokens")
  if top_logprobs and not logprobs:
    raise ValueError(f"top_logprobs={top_logprobs} needs logprobs=True: the top tokens are "
                     "returned beside each output token's own log-probability")


def token_logprobs(logits_BxJxV: jax.Array, tokens_BxJ: jax.Array,
                   top_logprobs: int = 0) -> TokenLogprobs:
  """log softmax(logits) at each position's token, and its top `top_logprobs` entries (a token
  outside the vocab, such as a non-finite row's -1, reads some entry: the caller masks those
  rows)."""
  logits = logits_BxJxV.astype(jnp.float32)
  log_norm_BxJ = jax.nn.logsumexp(logits, axis=-1)
  picked_BxJ = jnp.take_along_axis(logits, jnp.maximum(tokens_BxJ, 0)[..., None], axis=-1)[..., 0]
  chosen_BxJ = picked_BxJ - log_norm_BxJ
  if not top_logprobs:
    return TokenLogprobs(chosen_BxJ)
  top_logits_BxJxL, top_ids_BxJxL = jax.lax.top_k(logits, top_logprobs)
  return TokenLogprobs(chosen_BxJ, top_ids_BxJxL.astype(jnp.int32),
                       top_logits_BxJxL - log_norm_BxJ[..., None])


def block_logprobs(logits_BxJxV: jax.Array, draft_BxD: jax.Array, num_accepted_B: jax.Array,
                   next_token_B: jax.Array, top_logprobs: int = 0) -> TokenLogprobs:
  """For a verified block whose position j's logits predict its token j: the accepted drafts
  draft[:a], then the rule's next token at position a (entries past a: the draft's, never
  committed). J <= D + 1."""
  j = logits_BxJxV.shape[1]
  draft_BxJ = jnp.pad(draft_BxD, ((0, 0), (0, max(0, j - draft_BxD.shape[1]))))[:, :j]
  tokens_BxJ = jnp.where(jnp.arange(j)[None] == num_accepted_B[:, None],
                         next_token_B[:, None], draft_BxJ)
  return token_logprobs(logits_BxJxV, tokens_BxJ, top_logprobs)


def empty_buffer(batch: int, width: int, top_logprobs: int) -> TokenLogprobs:
  """A loop's buffer for `width` positions: log p 0 and top ids -1 where nothing was written."""
  if not top_logprobs:
    return TokenLogprobs(jnp.zeros((batch, width), jnp.float32))
  return TokenLogprobs(jnp.zeros((batch, width), jnp.float32),
                       jnp.full((batch, width, top_logprobs), -1, jnp.int32),
                       jnp.zeros((batch, width, top_logprobs), jnp.float32))


def pad_positions(block: TokenLogprobs, width: int) -> TokenLogprobs:
  """The block with zero entries appended up to `width` positions (a narrower verify round's
  block next to the loop's widest)."""
  def pad(x):
    return jnp.pad(x, [(0, 0), (0, width - x.shape[1])] + [(0, 0)] * (x.ndim - 2))
  return jax.tree.map(pad, block)


def write(buffer: TokenLogprobs, rows, cols, block: TokenLogprobs) -> TokenLogprobs:
  """buffer[rows, cols] = block entry by entry (indices as `.at[rows, cols]`; out-of-range
  columns are dropped, which is how the loops skip what they do not commit)."""
  return jax.tree.map(lambda buf, new: buf.at[rows, cols].set(new, mode="drop"), buffer, block)


def keep_first(buffer: TokenLogprobs, num_B: jax.Array, width: int) -> TokenLogprobs:
  """The first `width` positions, with every entry past each row's num_B reset (log p 0, ids
  -1): what a result returns."""
  keep_BxN = jnp.arange(width)[None] < num_B[:, None]
  top_logprobs = 0 if buffer.top_ids_BxJxL is None else buffer.top_ids_BxJxL.shape[-1]

  def cut(x, empty):
    keep = keep_BxN.reshape(keep_BxN.shape + (1,) * (x.ndim - 2))
    return jnp.where(keep, x[:, :width], empty)

  return jax.tree.map(cut, buffer, empty_buffer(num_B.shape[0], width, top_logprobs))
