"""The round loop state shared by the chain and tree speculative engines, and its commit step.

`asd_decode` (spec_decode.py) and `asd_tree_decode` (tree_decode.py) differ in how they draft
and verify; both carry one `RoundState` through a `lax.while_loop`, start it with
`initial_state` (prefill's token committed), end each round with `commit_round` (the accepted
tokens plus the rule's next token; EOS, max_new_B and stop-string truncation; stats; streaming)
and turn it into a `SpecDecodeResult` with `finish`.

Shape notation: B rows, T prompt width, K draft block length (a tree's path depth), V vocab,
W = max_new_tokens + K + 1 (output buffer with room for one round's overshoot), S cache slots.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from asd_jax import logit_edits
from asd_jax.decode_stats import DecodeStats
from asd_jax.eos import is_eos
from asd_jax.sampling import select_token
from asd_jax.sampling_keys import split_keys
from asd_jax.host_calls import NO_HOST_CALL, HostCall
from asd_jax.stop_strings import keep_until_stop
from asd_jax import token_logprobs
from asd_jax.token_stream import emit


@flax.struct.dataclass
class SpecDecodeResult:
  """tokens_BxN (-1 past num_generated_B), num_generated_B, nonfinite_B (row stopped on NaN/inf
  logits without emitting the bad token), stats (DecodeStats), logprobs_BxN (with
  logprobs=True: each token's target log-probability, asd_jax/token_logprobs.py; 0 past
  num_generated_B; else None), top_token_ids_BxNxL and top_logprobs_BxNxL (with
  top_logprobs=L > 0: the target's L most likely tokens at each output position and their
  log-probabilities, most likely first; ids -1 and 0 past num_generated_B; else None)."""

  tokens_BxN: jax.Array
  num_generated_B: jax.Array
  nonfinite_B: jax.Array
  stats: DecodeStats
  logprobs_BxN: jax.Array | None = None
  top_token_ids_BxNxL: jax.Array | None = None
  top_logprobs_BxNxL: jax.Array | None = None


@flax.struct.dataclass
class RoundState:
  round: jax.Array
  tokens_BxW: jax.Array
  num_generated_B: jax.Array
  committed_B: jax.Array  # n: committed length including the prompt
  recent_Bx2: jax.Array  # committed tokens at positions n-2, n-1
  done_B: jax.Array
  nonfinite_B: jax.Array
  stats: DecodeStats
  target_cache: object
  drafter_state: object
  rng: jax.Array
  history_BxS: jax.Array  # token at each position (tree drafters re-read it); [B, 0] for chains
  # beside tokens_BxW, with logprobs=True
  logprobs: token_logprobs.TokenLogprobs | None = None
  # what the logit edits read (the committed output), when one is on
  token_counts: logit_edits.TokenCounts | None = None


def commit_round(state: RoundState, draft_BxK, verdict, max_new_B, eos_ids,
                 host: HostCall = NO_HOST_CALL,
                 logprobs_BxK1: token_logprobs.TokenLogprobs | None = None,
                 eos_rows_BxE=None,
                 edits: logit_edits.LogitEdits = logit_edits.OFF) -> RoundState:
  """Appends x_{<a} + next_token to each active row; EOS, max_new_B and stop strings
  truncate. logprobs_BxK1 (with logprobs=True): the block's token log-probabilities.
  eos_rows_BxE: which of eos_ids ends each row (asd_jax/eos.py; None: all of them); edits:
  the request's logit edits (a guide's state follows the committed tokens)."""
  b, k = draft_BxK.shape
  active_B = ~state.done_B & ~verdict.nonfinite
  a_B = verdict.num_accepted
  j_K1 = jnp.arange(k + 1)
  block_BxK1 = jnp.concatenate([draft_BxK, jnp.zeros((b, 1), jnp.int32)], axis=1)
  block_BxK1 = jnp.where(j_K1[None] == a_B[:, None], verdict.next_token[:, None], block_BxK1)
  in_block_BxK1 = j_K1[None] <= a_B[:, None]

  count_B = a_B + 1
  if eos_ids:
    is_eos_BxK1 = in_block_BxK1 & is_eos(block_BxK1, eos_ids, eos_rows_BxE)
    hit_B = is_eos_BxK1.any(axis=1)
    count_B = jnp.where(hit_B, jnp.argmax(is_eos_BxK1, axis=1) + 1, count_B)
  else:
    hit_B = jnp.zeros((b,), bool)
  count_B = jnp.minimum(count_B, max_new_B - state.num_generated_B)
  count_B = jnp.where(active_B, count_B, 0)

  rows_Bx1 = jnp.arange(b)[:, None]
  cols_BxK1 = state.num_generated_B[:, None] + j_K1[None]
  cols_BxK1 = jnp.where(j_K1[None] < count_B[:, None], cols_BxK1, state.tokens_BxW.shape[1])
  tokens_BxW = state.tokens_BxW.at[rows_Bx1, cols_BxK1].set(block_BxK1, mode="drop")
  logprobs = state.logprobs
  if logprobs is not None:
    logprobs = token_logprobs.write(logprobs, rows_Bx1, cols_BxK1, logprobs_BxK1)
  # A stop string completed inside the block drops the tokens after it; they stay in the buffer
  # past num_generated_B, where `finish` masks them.
  num_generated_B, stopped_B = keep_until_stop(host, tokens_BxW, state.num_generated_B,
                                               state.num_generated_B + count_B)
  count_B = num_generated_B - state.num_generated_B
  token_counts = logit_edits.add_output(state.token_counts, block_BxK1,
                                          j_K1[None] < count_B[:, None], edits)
  history_pos_BxK1 = jnp.where(in_block_BxK1 & active_B[:, None],
                               state.committed_B[:, None] + j_K1[None],
                               state.history_BxS.shape[1])
  history_BxS = state.history_BxS.at[rows_Bx1, history_pos_BxK1].set(block_BxK1, mode="drop")

  # The caches hold everything up to the accepted draft; the next round re-feeds the last two.
  before_last_B = jnp.where(a_B > 0, jnp.take_along_axis(
      draft_BxK, jnp.maximum(a_B - 1, 0)[:, None], axis=1)[:, 0], state.recent_Bx2[:, 1])
  recent_Bx2 = jnp.where(active_B[:, None],
                         jnp.stack([before_last_B, verdict.next_token], axis=1), state.recent_Bx2)
  committed_B = jnp.where(active_B, state.committed_B + a_B + 1, state.committed_B)

  live_B = ~state.done_B
  s = state.stats
  # The stats count output tokens only: a row's last round may accept drafts past an EOS, a stop
  # string or max_new_tokens, and then neither they nor the round's bonus token are output.
  committed_drafts_B = jnp.where(active_B, jnp.minimum(a_B, count_B), 0)
  stats = DecodeStats(
      rounds_B=s.rounds_B + live_B,
      round_tokens_B=s.round_tokens_B + count_B,
      accepted_B=s.accepted_B + committed_drafts_B,
      accepted_per_position_BxK=s.accepted_per_position_BxK
      + (jnp.arange(k)[None] < committed_drafts_B[:, None]),
      asd_exceptions_B=s.asd_exceptions_B + jnp.where(active_B, verdict.num_exceptions, 0),
      asd_spent_B=jnp.where(active_B, verdict.spent, s.asd_spent_B),
  )
  nonfinite_B = state.nonfinite_B | (live_B & verdict.nonfinite)
  done_B = (state.done_B | nonfinite_B | (active_B & hit_B) | stopped_B
            | (num_generated_B >= max_new_B))
  emit(host, tokens_BxW, state.num_generated_B, num_generated_B)
  return state.replace(tokens_BxW=tokens_BxW, num_generated_B=num_generated_B,
                       committed_B=committed_B, recent_Bx2=recent_Bx2, done_B=done_B,
                       nonfinite_B=nonfinite_B, stats=stats, history_BxS=history_BxS,
                       logprobs=logprobs, token_counts=token_counts)


def initial_state(prompt_BxT, lengths_B, max_new_B, first_logits_BxV, rng, sampling, eos_ids, *,
                  max_new_tokens, depth, target_cache, drafter_state, history_width,
                  host: HostCall = NO_HOST_CALL, logprobs: bool = False,
                  top_logprobs: int = 0,
                  edits: logit_edits.LogitEdits = logit_edits.OFF, eos_rows_BxE=None):
  """Loop state after prefill: the first token (from the prefill logits) is committed."""
  b = prompt_BxT.shape[0]
  rng, sub = split_keys(rng, 2)
  token_counts = logit_edits.count_prompt(prompt_BxT, lengths_B, first_logits_BxV.shape[-1],
                                          edits)
  first_B = select_token(logit_edits.edit_logits(first_logits_BxV, token_counts, edits), sub,
                         sampling)
  first_ok_B = jnp.isfinite(first_logits_BxV).all(axis=-1)
  last_prompt_B = jnp.take_along_axis(prompt_BxT, (lengths_B - 1)[:, None], axis=1)[:, 0]
  width = max_new_tokens + depth + 1
  emit_B = first_ok_B & (max_new_B > 0)
  tokens_BxW = jnp.full((b, width), -1, jnp.int32).at[:, 0].set(jnp.where(emit_B, first_B, -1))
  num_generated_B = emit_B.astype(jnp.int32)
  logprobs_buffer = None
  if logprobs:
    logprobs_buffer = token_logprobs.write(
        token_logprobs.empty_buffer(b, width, top_logprobs), jnp.arange(b)[:, None],
        jnp.zeros((b, 1), jnp.int32),
        token_logprobs.token_logprobs(first_logits_BxV[:, None], first_B[:, None], top_logprobs))
  _, stopped_B = keep_until_stop(host, tokens_BxW, jnp.zeros_like(num_generated_B),
                                 num_generated_B)
  emit(host, tokens_BxW, jnp.zeros_like(num_generated_B), num_generated_B)
  first_eos_B = is_eos(first_B, eos_ids, eos_rows_BxE)
  history_BxS = jnp.zeros((b, history_width), jnp.int32)
  if history_width:
    t = prompt_BxT.shape[1]
    history_BxS = history_BxS.at[:, :t].set(prompt_BxT)
    history_BxS = history_BxS.at[jnp.arange(b), lengths_B].set(first_B)
  zeros_B = jnp.zeros((b,), jnp.int32)
  return RoundState(
      round=jnp.zeros((), jnp.int32),
      tokens_BxW=tokens_BxW,
      num_generated_B=num_generated_B,
      committed_B=lengths_B + 1,
      recent_Bx2=jnp.stack([last_prompt_B, first_B], axis=1),
      done_B=~emit_B | (emit_B & first_eos_B) | stopped_B | (num_generated_B >= max_new_B),
      nonfinite_B=~first_ok_B,
      stats=DecodeStats(rounds_B=zeros_B, round_tokens_B=zeros_B, accepted_B=zeros_B,
                        accepted_per_position_BxK=jnp.zeros((b, depth), jnp.int32),
                        asd_exceptions_B=zeros_B, asd_spent_B=jnp.zeros((b,), jnp.float32)),
      target_cache=target_cache, drafter_state=drafter_state, rng=rng,
      history_BxS=history_BxS, logprobs=logprobs_buffer,
      token_counts=logit_edits.add_output(token_counts, first_B[:, None], emit_B[:, None],
                                          edits))


def finish(state: RoundState, max_new_tokens: int) -> SpecDecodeResult:
  keep_BxN = jnp.arange(max_new_tokens)[None] < state.num_generated_B[:, None]
  tokens_BxN = jnp.where(keep_BxN, state.tokens_BxW[:, :max_new_tokens], -1)
  result = SpecDecodeResult(tokens_BxN=tokens_BxN, num_generated_B=state.num_generated_B,
                            nonfinite_B=state.nonfinite_B, stats=state.stats)
  if state.logprobs is None:
    return result
  lp = token_logprobs.keep_first(state.logprobs, state.num_generated_B, max_new_tokens)
  return result.replace(logprobs_BxN=lp.chosen_BxJ, top_token_ids_BxNxL=lp.top_ids_BxJxL,
                        top_logprobs_BxNxL=lp.top_BxJxL)
