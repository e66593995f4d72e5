"""Plain autoregressive decoding: the baseline every speedup is measured against.

One jitted program: prefill, then a `lax.while_loop` that runs one target forward per step for
the whole batch, with per-row EOS and max_new_tokens. Rows are right-padded (see lm_api).

Shape notation: B rows, T prompt width, N = max_new_tokens, V vocab.
"""

from __future__ import annotations

import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp

from asd_jax import logit_edits, output_buffer, request_checks
from asd_jax.eos import is_eos
from asd_jax.lm_api import LanguageModelFns, check_logits
from asd_jax.logit_edits import LogitEdits, TokenCounts
from asd_jax.sampling import SamplingConfig, sampling_for_rows, select_token
from asd_jax.spec_sampling import Filters
from asd_jax.sampling_keys import row_keys, split_keys
from asd_jax.host_calls import HostCall, finish_host_calls, host_calls
from asd_jax.stop_strings import StopArg, keep_until_stop, row_stops
from asd_jax import token_logprobs
from asd_jax.token_stream import TokenStream, check_stream, emit

# XLA's copy insertion with region analysis sees that a decode loop reads each KV-cache buffer
# before it writes it (models/cached_attention.py), so it updates the buffer in place instead of
# copying every layer's keys and values on every step (tests/test_cached_attention.py). Inside
# the branches of a lax.switch/cond each buffer is still copied once. A DebugOptions field:
# other backends ignore it.
DECODE_LOOP_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}


@flax.struct.dataclass
class DecodeResult:
  """Output of a decode call.

  tokens_BxN: generated ids (EOS included when hit); entries past num_generated_B are -1.
  num_generated_B: generated tokens per row.
  nonfinite_B: True where the model produced NaN/inf logits; the row stopped there and the
    offending token was not emitted.
  target_forwards_B: target forward passes that produced this row's tokens (prefill counts 1
    when it produced the row's first token; 0 for a row with max_new_B 0).
  logprobs_BxN: with logprobs=True, each token's log-probability under the model
    (asd_jax/token_logprobs.py), 0 past num_generated_B; else None.
  top_token_ids_BxNxL, top_logprobs_BxNxL: with top_logprobs=L > 0, the L most likely tokens
    at each output position and their log-probabilities, most likely first (ids -1 and 0 past
    num_generated_B); else None.
  """

  tokens_BxN: jax.Array
  num_generated_B: jax.Array
  nonfinite_B: jax.Array
  target_forwards_B: jax.Array
  logprobs_BxN: jax.Array | None = None
  top_token_ids_BxNxL: jax.Array | None = None
  top_logprobs_BxNxL: jax.Array | None = None


@flax.struct.dataclass
class _LoopState:
  step: jax.Array
  tokens_BxN: jax.Array
  num_generated_B: jax.Array
  done_B: jax.Array
  nonfinite_B: jax.Array
  forwards_B: jax.Array
  cache: object
  rng: jax.Array
  logprobs: token_logprobs.TokenLogprobs | None = None  # beside tokens_BxN, with logprobs=True
  token_counts: TokenCounts | None = None  # what the logit edits read, when one is on


def _emit(state: _LoopState, logits_BxV, rng, max_new_B, eos_ids, eos_rows_BxE, sampling,
          edits, host: HostCall, top_logprobs: int) -> _LoopState:
  finite_B = jnp.isfinite(logits_BxV).all(axis=-1)
  token_B = select_token(logit_edits.edit_logits(logits_BxV, state.token_counts, edits), rng,
                         sampling)
  write_B = ~state.done_B & finite_B
  rows = jnp.arange(token_B.shape[0])
  col_B = jnp.where(write_B, state.num_generated_B, state.tokens_BxN.shape[1])  # OOB = dropped
  tokens_BxN = state.tokens_BxN.at[rows, col_B].set(token_B, mode="drop")
  logprobs = state.logprobs
  if logprobs is not None:
    step = token_logprobs.token_logprobs(logits_BxV[:, None], token_B[:, None], top_logprobs)
    logprobs = token_logprobs.write(logprobs, rows[:, None], col_B[:, None], step)
  num_generated_B = state.num_generated_B + write_B.astype(jnp.int32)
  _, stopped_B = keep_until_stop(host, tokens_BxN, state.num_generated_B, num_generated_B)
  is_eos_B = is_eos(token_B, eos_ids, eos_rows_BxE)
  nonfinite_B = state.nonfinite_B | (~state.done_B & ~finite_B)
  done_B = (state.done_B | nonfinite_B | (write_B & is_eos_B) | stopped_B
            | (num_generated_B >= max_new_B))
  emit(host, tokens_BxN, state.num_generated_B, num_generated_B)
  return state.replace(tokens_BxN=tokens_BxN, num_generated_B=num_generated_B, done_B=done_B,
                       nonfinite_B=nonfinite_B, logprobs=logprobs,
                       token_counts=logit_edits.add_output(state.token_counts,
                                                           token_B[:, None], write_B[:, None],
                                                           edits),
                       forwards_B=state.forwards_B + (~state.done_B).astype(jnp.int32))


@functools.partial(jax.jit, static_argnames=("fns", "max_new_tokens", "capacity", "eos_ids",
                                             "logprobs", "top_logprobs"),
                   compiler_options=DECODE_LOOP_COMPILER_OPTIONS)
def _plain_decode(fns: LanguageModelFns, params, prompt_BxT, lengths_B, max_new_B, rng, *,
                  max_new_tokens: int, capacity: int, eos_ids: tuple[int, ...],
                  sampling: Filters, edits: LogitEdits, host: HostCall, logprobs: bool,
                  top_logprobs: int, eos_rows_BxE=None) -> DecodeResult:
  b = prompt_BxT.shape[0]
  cache = fns.init_cache(b, capacity)
  logits_BxV, _, cache = fns.prefill(params, prompt_BxT, lengths_B, cache)
  check_logits(fns, logits_BxV, (b, fns.vocab_size), "prefill")
  rng, sub = split_keys(rng, 2)
  state = _LoopState(
      step=jnp.zeros((), jnp.int32),
      tokens_BxN=jnp.full((b, max_new_tokens), -1, jnp.int32),
      num_generated_B=jnp.zeros((b,), jnp.int32),
      done_B=max_new_B <= 0,
      nonfinite_B=jnp.zeros((b,), bool),
      forwards_B=jnp.zeros((b,), jnp.int32),
      cache=cache, rng=rng,
      logprobs=(token_logprobs.empty_buffer(b, max_new_tokens, top_logprobs) if logprobs
                else None),
      token_counts=logit_edits.count_prompt(prompt_BxT, lengths_B, fns.vocab_size, edits))
  state = _emit(state, logits_BxV, sub, max_new_B, eos_ids, eos_rows_BxE, sampling, edits, host,
                top_logprobs)

  def cond(s: _LoopState):
    return (s.step < max_new_tokens - 1) & ~jnp.all(s.done_B)

  def body(s: _LoopState):
    last_B = jnp.take_along_axis(s.tokens_BxN, jnp.maximum(s.num_generated_B - 1, 0)[:, None],
                                 axis=1)[:, 0]
    # Finished rows keep computing (static shapes) but re-write their own last slot harmlessly.
    position_B = lengths_B + jnp.maximum(s.num_generated_B - 1, 0)
    logits_Bx1xV, _, cache = fns.forward(params, jnp.maximum(last_B, 0)[:, None],
                                         position_B[:, None], s.cache)
    check_logits(fns, logits_Bx1xV, (b, 1, fns.vocab_size), "forward")
    rng, sub = split_keys(s.rng, 2)
    s = s.replace(step=s.step + 1, cache=cache, rng=rng)
    return _emit(s, logits_Bx1xV[:, 0], sub, max_new_B, eos_ids, eos_rows_BxE, sampling, edits,
                 host, top_logprobs)

  state = jax.lax.while_loop(cond, body, state)
  result = DecodeResult(tokens_BxN=state.tokens_BxN, num_generated_B=state.num_generated_B,
                        nonfinite_B=state.nonfinite_B, target_forwards_B=state.forwards_B)
  if state.logprobs is None:
    return result
  # Written only where a token was: entries past num_generated_B are still the buffer's empty.
  lp = state.logprobs
  return result.replace(logprobs_BxN=lp.chosen_BxJ, top_token_ids_BxNxL=lp.top_ids_BxJxL,
                        top_logprobs_BxNxL=lp.top_BxJxL)


def plain_decode(fns: LanguageModelFns, params, prompt_BxT, lengths_B, *, max_new_tokens: int,
                 eos_ids=(), sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
                 seed: int = 0,
                 max_new_B=None, capacity: int | None = None,
                 stream: TokenStream | None = None,
                 stop: StopArg = None, logprobs: bool = False,
                 top_logprobs: int = 0) -> DecodeResult:
  """Generates up to `max_new_tokens` tokens per row (jitted, on device).

  Args:
    prompt_BxT, lengths_B: right-padded prompt ids and their lengths (>= 1 each). The width
      T is a static shape: pad it to a bucket (asd_jax.cli_common.right_pad rounds up to a
      multiple of 32) so that prompts of nearby lengths share one compiled program.
    max_new_tokens: tokens to generate at most (the output width); max_new_B optionally lowers
      it per row. Requests whose max_new_tokens round up to the same multiple of 64 share one
      compiled program (asd_jax/output_buffer.py).
    eos_ids: a row stops after emitting any of these (it is included in the output); or a
      list with one set of ids per row (asd_jax/eos.py).
    sampling: greedy by default; its logit edits (asd_jax/logit_edits.py) apply too. One
      SamplingConfig for every row, or a list with one per row (a batch of requests that
      sample differently): each row decodes as it would alone with its own settings.
    seed: an int, or int[B] one per request; each row samples from its own key
      (asd_jax.sampling_keys.row_keys), so a row's output does not depend on its batch.
    capacity: KV-cache slots per row (static); default: prompt width + max_new_tokens rounded
      up to a multiple of 64, so nearby output lengths share one compiled program.
    stream: a TokenStream to receive each row's tokens on the host as they are generated.
    stop: StopStrings (every row) or a list with a StopStrings or None per row; a row ends
      with the token that completes one of its stop strings in its text.
    logprobs: also return each token's log-probability under the model
      (DecodeResult.logprobs_BxN; asd_jax/token_logprobs.py).
    top_logprobs: with logprobs, also the L most likely tokens at each position and their
      log-probabilities (DecodeResult.top_token_ids_BxNxL / top_logprobs_BxNxL).
  """
  request_checks.check_type("fns", fns, LanguageModelFns)
  prompt, lengths, max_new_tokens, eos_ids, eos_rows, max_new_B = (
      request_checks.check_request_tokens(fns, prompt_BxT, lengths_B,
                                          max_new_tokens=max_new_tokens, eos_ids=eos_ids,
                                          max_new_B=max_new_B))
  sampling = sampling_for_rows(sampling, prompt.shape[0])
  capacity = request_checks.resolve_capacity(
      capacity, prompt.shape[1] + max_new_tokens, "prompt + max_new_tokens",
      window_needs=fns.max_positions, model=fns.name)
  request_checks.check_param_shapes("params", params, fns.param_shapes, fns.name)
  check_stream(stream)
  token_logprobs.check_logprobs_request(logprobs, top_logprobs, fns.vocab_size)
  edits = logit_edits.for_eos_rows(sampling.logit_edits(fns.vocab_size, eos_ids, max_new_tokens),
                                   eos_rows)
  stops = row_stops(stop, prompt.shape[0], min_tokens=sampling.min_tokens)
  with host_calls(stream=stream, stop=stops) as host:
    result = _plain_decode(fns, params, jnp.asarray(prompt), jnp.asarray(lengths),
                           jnp.asarray(max_new_B), row_keys(seed, prompt.shape[0]),
                           max_new_tokens=output_buffer.buffer_width(max_new_tokens),
                           capacity=capacity, eos_ids=eos_ids, sampling=sampling.filters(),
                           edits=edits,
                           host=host, logprobs=logprobs, top_logprobs=top_logprobs,
                           eos_rows_BxE=None if eos_rows is None else jnp.asarray(eos_rows))
    return output_buffer.trim(finish_host_calls(host, result), max_new_tokens)
