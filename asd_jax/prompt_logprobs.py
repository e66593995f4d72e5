"""Log-probabilities of a prompt's own tokens under a model (vLLM's `prompt_logprobs`): for
scoring text (perplexity, the likelihood of each answer of a multiple-choice question,
reranking) and for checking a loaded model against another implementation token by token.

Entry t of a row is log p(prompt[t] | prompt[:t]) from the raw logits' log-softmax (before any
sampling setting, as the engines' output logprobs). Entry 0 has no context to be predicted
from and, like every entry past the row's length, holds log p 0 and top ids -1.

One jitted program runs the prompt through the model CHUNK positions at a time (a `lax.scan`
over the KV cache), so it holds [B, CHUNK, V] logits at once, never [B, T, V]: an 8k-token
prompt under a 150k vocabulary would be 4.9 GB of float32 logits per row. It is a forward of
its own, not read from a decode engine's prefill: `LanguageModelFns.prefill` computes the
logits after each row's last token only (the one decoding needs), so asking generate for both
costs one more pass over the prompt (scripts/option_overhead.py --option prompt-logprobs).

Shape notation: B rows, T prompt width, C chunk, V vocab, L = top_logprobs.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from asd_jax import request_checks
from asd_jax.lm_api import LanguageModelFns, check_logits
from asd_jax.token_logprobs import check_logprobs_request, empty_buffer, token_logprobs

# Positions scored per forward: 128 rows of a 49k vocabulary are 25 MB of float32 logits per
# prompt row. On two CPU cores (scripts/prompt_logprobs_cost.py, SmolLM2, a 2054-token prompt)
# chunks of 64 and 128 scored in 7.3 s, 256 in 8.6 s, 512 in 10.6 s (the logits and their
# softmax outgrow the caches) and 32 in 8.7 s; a 53-token prompt took 137 ms at 128, 130 ms at
# 256. Accelerators: not measured (larger chunks likely pay there).
CHUNK = 128


@flax.struct.dataclass
class PromptLogprobs:
  """logprobs_BxT[b, t] = log p(prompt[b, t] | prompt[b, :t]) for 1 <= t < lengths[b] (0
  elsewhere). With top_logprobs = L > 0, top_token_ids_BxTxL / top_logprobs_BxTxL: the L tokens
  the model found most likely at position t (given prompt[b, :t]), most likely first (ids -1
  where nothing was scored). nonfinite_B: the row's logits held a NaN or inf at a scored
  position (its values there are NaN; nothing is clamped)."""

  logprobs_BxT: jax.Array
  nonfinite_B: jax.Array
  top_token_ids_BxTxL: jax.Array | None = None
  top_logprobs_BxTxL: jax.Array | None = None


@functools.partial(jax.jit, static_argnames=("fns", "chunk", "top_logprobs"))
def _score_prompts(fns: LanguageModelFns, params, prompt_BxT, lengths_B, *, chunk: int,
                   top_logprobs: int) -> PromptLogprobs:
  b, t = prompt_BxT.shape
  # Position p predicts token p + 1; the last position predicts nothing (a 0 stands in).
  next_BxT = jnp.pad(prompt_BxT[:, 1:], ((0, 0), (0, 1)))

  def score_chunk(cache, start):
    tokens_BxC = jax.lax.dynamic_slice_in_dim(prompt_BxT, start, chunk, axis=1)
    positions_BxC = jnp.broadcast_to(start + jnp.arange(chunk, dtype=jnp.int32), (b, chunk))
    logits_BxCxV, _, cache = fns.forward(params, tokens_BxC, positions_BxC, cache)
    check_logits(fns, logits_BxCxV, (b, chunk, fns.vocab_size), "forward")
    scored = token_logprobs(logits_BxCxV,
                            jax.lax.dynamic_slice_in_dim(next_BxT, start, chunk, axis=1),
                            top_logprobs)
    return cache, (scored, jnp.isfinite(logits_BxCxV).all(axis=-1))

  starts = jnp.arange(0, t, chunk, dtype=jnp.int32)
  _, (scored, finite) = jax.lax.scan(score_chunk, fns.init_cache(b, t), starts)

  def join_chunks(x):  # [T / C, B, C, ...] -> [B, T, ...]
    return jnp.moveaxis(x, 0, 1).reshape((b, t) + x.shape[3:])

  scored, finite_BxT = jax.tree.map(join_chunks, (scored, finite))
  predicts_BxT = jnp.arange(t)[None] < (lengths_B - 1)[:, None]  # predicts a token of the row
  empty = empty_buffer(b, t, top_logprobs)

  def shift_right(x, nothing):  # entry p + 1 holds what position p predicted
    keep = predicts_BxT.reshape(predicts_BxT.shape + (1,) * (x.ndim - 2))
    return nothing.at[:, 1:].set(jnp.where(keep, x, nothing)[:, :-1])

  aligned = jax.tree.map(shift_right, scored, empty)
  return PromptLogprobs(logprobs_BxT=aligned.chosen_BxJ,
                        nonfinite_B=(predicts_BxT & ~finite_BxT).any(axis=1),
                        top_token_ids_BxTxL=aligned.top_ids_BxJxL,
                        top_logprobs_BxTxL=aligned.top_BxJxL)


def prompt_logprobs(fns: LanguageModelFns, params, prompt_BxT, lengths_B, *,
                    top_logprobs: int = 0, chunk: int = CHUNK) -> PromptLogprobs:
  """Scores right-padded prompts (row b: prompt_BxT[b, :lengths_B[b]]) under the model.

  The width T is a static shape, as in the decode engines: pad it to a bucket
  (asd_jax.cli_common.right_pad) so prompts of nearby lengths share one compiled program.
  chunk: positions per forward (memory holds [B, chunk, V] logits); the width is padded up to
  a multiple of it, and a narrower prompt is scored in one chunk of its width rounded up to 32.
  A row's values do not depend on its batch or on chunk, up to float rounding.
  """
  request_checks.check_type("fns", fns, LanguageModelFns)
  prompt, lengths = request_checks.check_prompts(prompt_BxT, lengths_B, fns.vocab_size)
  check_logprobs_request(True, top_logprobs, fns.vocab_size)
  chunk = request_checks.check_positive_int("chunk", chunk)
  longest = int(lengths.max())
  if fns.max_positions is not None and longest > fns.max_positions:
    raise ValueError(f"prompt ({longest} tokens) exceeds the context window of {fns.name!r} "
                     f"({fns.max_positions} positions); shorten it")
  request_checks.check_param_shapes("params", params, fns.param_shapes, fns.name)
  chunk = min(chunk, request_checks.round_up(prompt.shape[1], 32))
  width = request_checks.round_up(prompt.shape[1], chunk)
  prompt = np.pad(prompt, ((0, 0), (0, width - prompt.shape[1])))
  scored = _score_prompts(fns, params, jnp.asarray(prompt), jnp.asarray(lengths), chunk=chunk,
                          top_logprobs=top_logprobs)
  t = np.shape(prompt_BxT)[1]  # the caller's width, not the chunks'
  return jax.tree.map(lambda x: x if x.ndim == 1 else x[:, :t], scored)
