"""`asd_decode`: speculative decoding on device, chain drafting, batch >= 1.

One jitted program: prefill (target and drafter), then a `lax.while_loop` of rounds. Each round
the drafter proposes K tokens per row, the target scores K+1 positions in one forward, the rule
(strict greedy, ASD, or lossless sampling) decides per row, and each row commits its accepted
prefix plus one target token. Caches are rewound implicitly: slot == position, and a row's
position pointer only advances by what it committed (see drafter_api for the bookkeeping).
The ASD regret ledger is one float per request in the loop state, for the whole request.

The loop state and its commit step are shared with the tree engine (decode_rounds.py).

Shape notation: B rows, T prompt width, K draft block length, V vocab.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax import logit_edits, output_buffer, request_checks
from asd_jax import verify_checks as checks
from asd_jax.asd_config import PAPER, ASDConfig
from asd_jax.asd_verify import asd_verify_traced, config_scalars
from asd_jax.decode_rounds import (RoundState, SpecDecodeResult, commit_round, finish,
                                   initial_state)
from asd_jax.drafter_api import ChainDrafter, check_proposal
from asd_jax.greedy_verify import greedy_verify
from asd_jax.lm_api import LanguageModelFns, check_logits
from asd_jax.logit_edits import LogitEdits
from asd_jax.plain_decode import DECODE_LOOP_COMPILER_OPTIONS
from asd_jax.sampling import RowSampling, SamplingConfig, sampling_for_rows, select_token
from asd_jax.sampling_keys import row_keys, split_keys
from asd_jax.spec_sampling import Filters, chain_sample_core, sample_without_draft
from asd_jax.host_calls import HostCall, finish_host_calls, host_calls
from asd_jax.stop_strings import StopArg, row_stops
from asd_jax import token_logprobs
from asd_jax.token_stream import TokenStream, check_stream
from asd_jax.verify_output import VerifyOutput

RULES = ("strict", "asd", "sample")


def _as_verdict(v) -> VerifyOutput:
  """The fields commit_round reads, in fixed dtypes (both branches of a lax.cond must match)."""
  return VerifyOutput(num_accepted=v.num_accepted.astype(jnp.int32),
                      next_token=v.next_token.astype(jnp.int32),
                      spent=v.spent.astype(jnp.float32),
                      num_exceptions=v.num_exceptions.astype(jnp.int32),
                      nonfinite=v.nonfinite.astype(bool))


def _verify(rule, draft_BxK, draft_logits, target_logits_BxK1xV, spent_B, asd_scalars, key,
            sampling: Filters, normalize_q: bool, draft_lengths_B, noise_slots: int):
  if rule == "strict":
    return greedy_verify(draft_BxK, target_logits_BxK1xV, spent_B, check_values=False)
  if rule == "asd":
    budget, gate, max_exceptions = asd_scalars
    # Traced settings: a budget sweep reuses one compiled program. They were validated as a
    # concrete ASDConfig at the Python boundary.
    return asd_verify_traced(draft_BxK, target_logits_BxK1xV, spent_B, budget, gate,
                             max_exceptions, normalize_q=normalize_q,
                             draft_lengths_B=draft_lengths_B)
  b, k = draft_BxK.shape
  lengths_B = checks.draft_lengths(draft_lengths_B, b, k, check_values=False)
  verdict = chain_sample_core(draft_BxK, draft_logits, target_logits_BxK1xV, key, lengths_B,
                              sampling, noise_slots=noise_slots)
  return verdict._replace(spent=spent_B)


@functools.partial(jax.jit, static_argnames=(
    "target", "drafter", "rule", "normalize_q", "max_new_tokens", "capacity", "eos_ids",
    "logprobs", "top_logprobs"), compiler_options=DECODE_LOOP_COMPILER_OPTIONS)
def _asd_decode(target: LanguageModelFns, target_params, drafter: ChainDrafter, drafter_params,
                prompt_BxT, lengths_B, max_new_B, asd_scalars, rng, *, rule: str,
                sampling: Filters, edits: LogitEdits, normalize_q: bool,
                max_new_tokens: int, capacity: int, eos_ids: tuple[int, ...], host: HostCall,
                logprobs: bool, top_logprobs: int,
                eos_rows_BxE=None) -> SpecDecodeResult:
  b = prompt_BxT.shape[0]
  k = drafter.num_draft
  target_cache = target.init_cache(b, capacity)
  first_logits_BxV, _, target_cache = target.prefill(target_params, prompt_BxT, lengths_B,
                                                     target_cache)
  check_logits(target, first_logits_BxV, (b, target.vocab_size), "prefill")
  drafter_state = drafter.prefill(drafter_params, prompt_BxT, lengths_B, capacity)
  state = initial_state(prompt_BxT, lengths_B, max_new_B, first_logits_BxV, rng, sampling,
                        eos_ids, max_new_tokens=max_new_tokens, depth=k,
                        target_cache=target_cache, drafter_state=drafter_state,
                        history_width=0, host=host, logprobs=logprobs,
                        top_logprobs=top_logprobs, edits=edits, eos_rows_BxE=eos_rows_BxE)

  def cond(s: RoundState):
    # Every active row commits >= 1 token per round, so max_new_tokens rounds always suffice.
    return ~jnp.all(s.done_B) & (s.round < max_new_tokens)

  def verify_round(width: int, s: RoundState, draft_BxK, draft_logits, k_verify, lengths_B):
    # Scores the first `width` draft tokens (width <= K); the verdict accepts at most those.
    draft_BxW = draft_BxK[:, :width]
    block_BxW1 = jnp.concatenate([s.recent_Bx2[:, 1:], draft_BxW], axis=1)
    positions_BxW1 = s.committed_B[:, None] - 1 + jnp.arange(width + 1)
    target_logits, _, target_cache = target.forward(target_params, block_BxW1, positions_BxW1,
                                                    s.target_cache)
    check_logits(target, target_logits, (b, width + 1, target.vocab_size), "forward")
    # Row j judges draft j in the context it has once accepted: the output plus draft[:j].
    verify_logits = logit_edits.edit_logits(target_logits, s.token_counts, edits,
                                            logit_edits.chain_context(draft_BxW))
    verdict = _verify(rule, draft_BxW, None if draft_logits is None else draft_logits[:, :width],
                      verify_logits, s.stats.asd_spent_B, asd_scalars, k_verify, sampling,
                      normalize_q, draft_lengths_B=lengths_B, noise_slots=k)
    verdict = _as_verdict(verdict)
    lp_BxK1 = None
    if logprobs:
      lp_BxK1 = token_logprobs.pad_positions(token_logprobs.block_logprobs(
          target_logits, draft_BxW, verdict.num_accepted, verdict.next_token, top_logprobs),
          k + 1)
    return target_cache, verdict, lp_BxK1

  def plain_step(s: RoundState, draft_BxK, draft_logits, k_verify, lengths_B):
    # A round in which every draft is rejected, at the cost of one token: the same commit
    # (the target's token at the newest position) without scoring K draft positions.
    del draft_BxK, draft_logits, lengths_B
    logits_Bx1xV, _, target_cache = target.forward(
        target_params, s.recent_Bx2[:, 1:], s.committed_B[:, None] - 1, s.target_cache)
    check_logits(target, logits_Bx1xV, (b, 1, target.vocab_size), "forward")
    logits_BxV = logit_edits.edit_logits(logits_Bx1xV[:, 0], s.token_counts, edits)
    if rule == "sample":  # the token a wider round would sample for an empty draft
      next_B = sample_without_draft(logits_BxV, k_verify, k, sampling)
    else:
      next_B = select_token(logits_BxV, k_verify, sampling)
    zeros_B = jnp.zeros((b,), jnp.int32)
    verdict = VerifyOutput(num_accepted=zeros_B, next_token=next_B,
                           spent=s.stats.asd_spent_B, num_exceptions=zeros_B,
                           nonfinite=~jnp.isfinite(logits_Bx1xV[:, 0]).all(axis=-1))
    lp_BxK1 = None
    if logprobs:
      lp_BxK1 = token_logprobs.pad_positions(token_logprobs.token_logprobs(
          logits_Bx1xV, next_B[:, None], top_logprobs), k + 1)
    return target_cache, _as_verdict(verdict), lp_BxK1

  def body(s: RoundState):
    rng, k_draft, k_verify = split_keys(s.rng, 3)
    positions_Bx2 = s.committed_B[:, None] + jnp.array([-2, -1])
    draft_edits = {}
    if drafter.takes_logit_edits and edits.on:
      draft_edits["edits"] = logit_edits.DraftLogitEdits(s.token_counts, edits)
    draft_BxK, draft_logits, drafter_state = drafter.propose(
        drafter_params, s.drafter_state, s.recent_Bx2, positions_Bx2, k_draft, sampling,
        **draft_edits)
    check_proposal(drafter, draft_BxK, draft_logits, b, sampled=rule == "sample")
    if drafter.draft_length is None:
      target_cache, verdict, lp_BxK1 = verify_round(k, s, draft_BxK, draft_logits, k_verify,
                                                    None)
    else:
      # The drafter's lengths depend on committed tokens only. Under strict the width never
      # changes the output, only what a round costs; a row's tokens past its own length may
      # still be accepted when another row widens the round (they are the target's own).
      # Under "asd" and "sample" each row is verified on its own draft only: ASD would
      # otherwise spend its budget on the filler of a row that drafted nothing whenever
      # another row widens the round, and "sample" draws its noise for K positions whatever
      # the width. So no row depends on the rest of its batch. Width 0 is a plain step.
      lengths_B = jnp.where(s.done_B, 0, drafter.draft_length(drafter_state))
      widths = (0,) + drafter.widths
      # A handful of widths: one comparison each ("compare_all"). The default binary search
      # is a while loop, and on a GPU every loop step costs kernel launches and a read of its
      # condition, each round.
      branch = jnp.searchsorted(jnp.asarray(widths, jnp.int32), jnp.max(lengths_B),
                                method="compare_all")
      branches = [plain_step] + [functools.partial(verify_round, w) for w in drafter.widths]
      own_B = None if rule == "strict" else lengths_B
      target_cache, verdict, lp_BxK1 = jax.lax.switch(branch, branches, s, draft_BxK,
                                                      draft_logits, k_verify, own_B)
    s = s.replace(round=s.round + 1, target_cache=target_cache, drafter_state=drafter_state,
                  rng=rng)
    return commit_round(s, draft_BxK, verdict, max_new_B, eos_ids, host, lp_BxK1,
                        eos_rows_BxE=eos_rows_BxE, edits=edits)

  state = jax.lax.while_loop(cond, body, state)
  return finish(state, max_new_tokens)


def required_capacity(prompt_width: int, max_new_tokens: int, num_draft: int) -> int:
  """Cache slots a request needs: prompt + output + one block's look-ahead (+1 spare)."""
  return prompt_width + max_new_tokens + num_draft + 1


def asd_decode(target: LanguageModelFns, target_params, drafter: ChainDrafter, drafter_params,
               prompt_BxT, lengths_B, *, max_new_tokens: int, rule: str = "strict",
               asd_config: ASDConfig = PAPER,
               sampling: SamplingConfig | Sequence[SamplingConfig] = SamplingConfig(),
               eos_ids=(), seed: int = 0,
               max_new_B=None, capacity: int | None = None,
               stream: TokenStream | None = None,
               stop: StopArg = None, logprobs: bool = False,
               top_logprobs: int = 0) -> SpecDecodeResult:
  """Speculative decoding with chain drafting (jitted; one call per batch of requests).

  Args:
    target, target_params: the target model's pure functions and parameters.
    drafter, drafter_params: a `ChainDrafter` (K = drafter.num_draft) and its parameters.
    prompt_BxT, lengths_B: right-padded prompts (each >= 1 token).
    max_new_tokens: tokens to generate at most (the output width); max_new_B optionally lowers
      it per row. Requests whose max_new_tokens round up to the same multiple of 64 share one
      compiled program (asd_jax/output_buffer.py).
    rule: "strict" (greedy verification; output == plain greedy decoding, in bfloat16 up to
      near-ties: a K+1-token block rounds otherwise than one-token steps), "asd" (ASD with
      `asd_config`; the ledger persists across rounds for the whole request) or "sample"
      (lossless speculative sampling with `sampling`; output distributed as plain sampling;
      at temperature 0 that is greedy decoding, and it runs as "strict"). `sampling` is one
      SamplingConfig for every row, or a list with one per row (a batch of requests that
      sample differently; each row decodes as it would alone; greedy rules need every row
      greedy, "sample" takes any mix, a temperature-0 row decoding greedily). `sampling`'s
      logit edits (logit_bias, the penalties, min_tokens, allowed_token_ids, bad words:
      asd_jax/logit_edits.py) apply under every rule: strict still equals plain greedy decoding
      with the same settings.
    eos_ids: a row stops after emitting any of these (kept in the output); or a list with one
      set of ids per row (asd_jax/eos.py).
    seed: an int, or int[B] one per request (asd_jax.sampling_keys.row_keys). Each row draws
      from its own key, so with per-request seeds a sampled row equals the same request run
      alone with its seed, whatever else is in the batch.
    capacity: cache slots per row (static); default: required_capacity rounded up to 64.
    stream: a TokenStream to receive each row's committed tokens on the host, round by round.
    stop: StopStrings (every row) or a list with a StopStrings or None per row; a row ends
      with the token that completes one of its stop strings in its text (tokens a
      round accepted past it are dropped).
    logprobs: also return each output token's log-probability under the target
      (SpecDecodeResult.logprobs_BxN; asd_jax/token_logprobs.py), from the verify forwards.
    top_logprobs: with logprobs, also the target's L most likely tokens at each output
      position and their log-probabilities (SpecDecodeResult.top_token_ids_BxNxL /
      top_logprobs_BxNxL), from the same forwards.

  Returns:
    SpecDecodeResult with tokens, lengths, non-finite flags and DecodeStats. Non-finite
    (NaN/inf) target logits for a row stop that row with nonfinite_B set; the token they would
    have chosen is not emitted (everything committed before stays). Non-finite drafter logits
    stop the row the same way under rule="sample"; under strict/asd the target verifies every
    drafted token, so a broken drafter only costs acceptance, never a wrong token.
  """
  if not isinstance(drafter, ChainDrafter):
    raise TypeError(f"drafter must be a ChainDrafter, got {type(drafter).__name__}")
  sampling = sampling_for_rows(sampling)
  req = prepare_request(target, drafter.vocab_size, prompt_BxT, lengths_B, rule=rule,
                        asd_config=asd_config, sampling=sampling, eos_ids=eos_ids,
                        max_new_tokens=max_new_tokens, max_new_B=max_new_B, capacity=capacity,
                        lookahead=drafter.num_draft, what=f"K={drafter.num_draft}", seed=seed,
                        drafter_window=(drafter.name, drafter.max_positions))
  return run_loop(_asd_decode, target, target_params, drafter, drafter_params, req,
                  sampling=sampling, normalize_q=asd_config.normalize_q, stream=stream,
                  stop=stop, logprobs=logprobs, top_logprobs=top_logprobs)


def run_loop(loop, target: LanguageModelFns, target_params, drafter, drafter_params,
             req: PreparedRequest, *, sampling: SamplingConfig | RowSampling, normalize_q: bool,
             stream: TokenStream | None, stop: StopArg, logprobs: bool, top_logprobs: int):
  """Runs a speculative decode loop (_asd_decode or tree_decode._tree_decode) on a prepared
  request: each model's params are checked to be its own (another model's fail here, naming
  the first array), the stream and stop strings are reset and their callbacks' exceptions
  re-raised."""
  request_checks.check_param_shapes("target_params", target_params, target.param_shapes,
                                    target.name)
  request_checks.check_param_shapes("drafter_params", drafter_params, drafter.param_shapes,
                                    drafter.name)
  check_stream(stream)
  token_logprobs.check_logprobs_request(logprobs, top_logprobs, target.vocab_size)
  edits = logit_edits.for_eos_rows(
      sampling.logit_edits(target.vocab_size, req.eos_ids, req.max_new_tokens), req.eos_rows)
  stops = row_stops(stop, req.arrays[0].shape[0], min_tokens=sampling.min_tokens)
  with host_calls(stream=stream, stop=stops) as host:
    result = loop(target, target_params, drafter, drafter_params, *req.arrays, rule=req.rule,
                  sampling=sampling.filters(), edits=edits, normalize_q=normalize_q,
                  max_new_tokens=output_buffer.buffer_width(req.max_new_tokens),
                  capacity=req.capacity, eos_ids=req.eos_ids, host=host, logprobs=logprobs,
                  top_logprobs=top_logprobs,
                  eos_rows_BxE=None if req.eos_rows is None else jnp.asarray(req.eos_rows))
    return output_buffer.trim(finish_host_calls(host, result), req.max_new_tokens)


@dataclasses.dataclass(frozen=True)
class PreparedRequest:
  arrays: tuple  # prompt_BxT, lengths_B, max_new_B, asd_scalars, a PRNG key per row
  max_new_tokens: int
  capacity: int
  eos_ids: tuple[int, ...]  # the union of the rows' ids
  # The rule the loop runs. "sample" at temperature 0 samples from point masses (the drafter's
  # and the target's argmax, as plain sampling at temperature 0 does), so it accepts exactly
  # what greedy verification accepts and runs as "strict"; greedy drafters give no draft
  # distribution for the sampling rule to read.
  rule: str
  eos_rows: np.ndarray | None = None  # bool[B, E]: which of eos_ids ends each row (eos.py)


def prepare_request(target: LanguageModelFns, drafter_vocab: int, prompt_BxT, lengths_B, *,
                    rule, asd_config, sampling, eos_ids, max_new_tokens, max_new_B, capacity,
                    lookahead: int, what: str, seed: int = 0,
                    drafter_window: tuple[str, int | None] = ("drafter", None)
                    ) -> PreparedRequest:
  """All Python-boundary checks of a speculative request; nothing is clamped.

  drafter_window: (the drafter's name, the positions it was trained for or None); a request
  past them gets a warning (request_checks.warn_past_drafter_window).
  """
  request_checks.check_type("target", target, LanguageModelFns)
  sampling = sampling_for_rows(sampling)
  request_checks.check_type("asd_config", asd_config, ASDConfig)
  if rule not in RULES:
    raise ValueError(f"unknown rule {rule!r}; choose one of {RULES}")
  if drafter_vocab != target.vocab_size:
    raise ValueError(f"drafter vocabulary ({drafter_vocab}) differs from the target's "
                     f"({target.vocab_size}); the drafter must share the target's tokenizer")
  if rule in ("strict", "asd") and not sampling.greedy:
    raise ValueError(f"rule {rule!r} is greedy (temperature 0); use rule='sample' for "
                     f"temperature {sampling.temperature}")
  prompt, lengths, max_new_tokens, eos_ids, eos_rows, max_new_B = (
      request_checks.check_request_tokens(
          target, prompt_BxT, lengths_B, max_new_tokens=max_new_tokens, eos_ids=eos_ids,
          max_new_B=max_new_B))
  sampling_for_rows(sampling, prompt.shape[0])  # a list of settings: one per row
  request_checks.warn_past_drafter_window(drafter_window[1], lengths, max_new_tokens,
                                          drafter_window[0])
  if target.max_positions is not None and lookahead >= target.max_positions:
    # Each round scores `lookahead` positions at once; a block longer than the context window
    # can never be accepted and would only allocate a cache that large.
    raise ValueError(f"{what} scores {lookahead} draft positions per round, not fewer than the "
                     f"context window of {target.name!r} ({target.max_positions} positions); "
                     f"draft fewer tokens")
  window_needs = (None if target.max_positions is None
                  else required_capacity(target.max_positions, 0, lookahead))
  capacity = request_checks.resolve_capacity(
      capacity, required_capacity(prompt.shape[1], max_new_tokens, lookahead),
      f"prompt + max_new_tokens + lookahead + 1 ({what})", window_needs=window_needs,
      model=target.name)
  arrays = (jnp.asarray(prompt), jnp.asarray(lengths), jnp.asarray(max_new_B),
            config_scalars(asd_config),
            row_keys(seed, prompt.shape[0]))
  loop_rule = "strict" if rule == "sample" and sampling.greedy else rule
  return PreparedRequest(arrays, max_new_tokens, capacity, eos_ids, loop_rule, eos_rows)
