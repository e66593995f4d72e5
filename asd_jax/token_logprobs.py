"""Log-probabilities of the output tokens under the target (the engines' `logprobs=True`).

Each output token's log p under the target's own distribution at that position: the raw logits'
log-softmax, before temperature, top-k or top-p (vLLM's raw logprobs). Speculative engines read
them from the verify forward that scored the token, so they cost no extra forward: a token the
target accepted from the draft is scored where the target saw it, and an ASD exception (a
mismatch accepted under the budget) shows as a token the target found unlikely. With greedy
strict decoding every token is the target's argmax.

Shape notation: B rows, J positions, V vocab.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(logits_BxJxV: jax.Array, tokens_BxJ: jax.Array) -> jax.Array:
  """float32[B, J]: log softmax(logits)[token] at each position (a token outside the vocab,
  such as a non-finite row's -1, reads some entry: the caller masks those rows)."""
  logits = logits_BxJxV.astype(jnp.float32)
  picked_BxJ = jnp.take_along_axis(logits, jnp.maximum(tokens_BxJ, 0)[..., None], axis=-1)[..., 0]
  return picked_BxJ - jax.nn.logsumexp(logits, axis=-1)


def block_logprobs(logits_BxJxV: jax.Array, draft_BxD: jax.Array, num_accepted_B: jax.Array,
                   next_token_B: jax.Array) -> jax.Array:
  """float32[B, J] for a verified block whose position j's logits predict its token j: the
  accepted drafts draft[:a], then the rule's next token at position a (entries past a: the
  draft's, never committed). J <= D + 1."""
  j = logits_BxJxV.shape[1]
  draft_BxJ = jnp.pad(draft_BxD, ((0, 0), (0, max(0, j - draft_BxD.shape[1]))))[:, :j]
  tokens_BxJ = jnp.where(jnp.arange(j)[None] == num_accepted_B[:, None],
                         next_token_B[:, None], draft_BxJ)
  return token_logprobs(logits_BxJxV, tokens_BxJ)
