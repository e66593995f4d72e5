"""The contract between the speculative decode loop and a chain drafter, plus the first drafter:
any language model (a small standalone LM, or the target itself as a self-draft).

Shape notation: B rows, T prompt width, K draft block length, V vocab.

Position bookkeeping shared with the engine: before a round a row has committed n tokens
(prompt included; the token at position n-1 is the newest). Target and drafter caches hold
valid entries for positions 0..n-2. `propose` receives the committed tokens at positions n-2
and n-1: feeding both (rather than only n-1) re-writes an entry that is already right and
fills the one entry a fully accepted block leaves missing (the last draft token is proposed
but never fed), so the drafter never needs a catch-up step, and its first forward has two rows,
which avoids XLA's slower single-row matmul path on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp

from asd_jax.lm_api import LanguageModelFns
from asd_jax.request_checks import check_positive_int
from asd_jax.sampling import select_token
from asd_jax.logit_edits import DraftLogitEdits
from asd_jax.spec_sampling import Filters
from asd_jax.sampling_keys import split_keys


@dataclasses.dataclass(frozen=True, eq=False)
class ChainDrafter:
  """Pure functions of a chain drafter. Hashes by identity (a static jit argument).

  prefill(params, prompt_BxT, lengths_B, capacity) -> state
  propose(params, state, recent_Bx2, positions_Bx2, rng, sampling)
      -> (draft_BxK int32, draft_logits_BxKxV float32 or None when sampling is greedy, state)
      rng is a key per row [B] (sampling.split_keys / select_token keep row b on rng[b]).
      sampling: the request's spec_sampling.Filters; `.greedy` and which filters are on are
      static, the values traced (probabilities / select_token take it as it is).
  draft_length(state) -> int32[B] in [0, K], optional: after propose, how many leading draft
      tokens of each row are worth verifying. The engine verifies the smallest width in
      `verify_widths` + (K,) that covers every active row's length (a longer draft is
      truncated, a shorter one padded with its own guesses, which only cost positions); when
      every active row's length is 0 it runs the round as one plain decoding step (a forward
      over 1 token; the commit is that of a round rejecting every draft token). It must depend
      on committed tokens only, never on randomness. Under strict no output then changes,
      only what a round costs. Under rules "asd" and "sample" a row accepts only its own
      first draft_length tokens (ASD's verdict on that shorter block; for "sample" a shorter
      draft, still lossless, with noise drawn for K positions at every width), so the row
      depends on its own length, never on the other rows' (asd_verify_traced's
      draft_lengths_B, spec_sampling.speculative_sample's draft_lengths / noise_slots). None:
      always verify all K.
  verify_widths: the widths below K the engine may verify instead (static: each one is a
      target forward of width + 1 tokens compiled into the loop).
  param_shapes: the arrays the params must have, as `LanguageModelFns.param_shapes` (None:
      not checked; drafters without weights).
  max_positions: the positions the drafter was trained for (None: no limit, e.g. no
      position encoding). A request reaching past them is decoded, with a warning: the drafts
      there degrade, which costs speed, never a wrong token.
  takes_logit_edits: propose also takes `edits=` (a logit_edits.DraftLogitEdits, when the
      request edits the logits: a penalty, a logit_bias, min_tokens, allowed_token_ids or bad
      words) and drafts under them: what the edited target picks. Its draft_logits are then the
      edited ones it sampled from. Drafters without it draft as usual (verification applies the
      edits either way).
  """

  prefill: Callable[..., Any]
  propose: Callable[..., tuple[jax.Array, Any, Any]]
  num_draft: int
  vocab_size: int
  name: str = "drafter"
  draft_length: Callable[[Any], jax.Array] | None = None
  verify_widths: tuple[int, ...] = ()
  param_shapes: tuple | None = None
  max_positions: int | None = None
  takes_logit_edits: bool = False

  def __post_init__(self):
    # 4.0 is taken as 4; 2.5, True, NaN or a string are refused before anything is traced.
    object.__setattr__(self, "num_draft",
                       check_positive_int("K (draft block length)", self.num_draft))
    if self.max_positions is not None:
      object.__setattr__(self, "max_positions",
                         check_positive_int("max_positions", self.max_positions))
    widths = tuple(self.verify_widths)
    if (any(isinstance(w, bool) or int(w) != w or not 0 < w < self.num_draft for w in widths)
        or list(widths) != sorted(set(widths))):
      raise ValueError(f"verify_widths must be increasing integers in [1, K={self.num_draft}), "
                       f"got {widths!r}")
    if widths and self.draft_length is None:
      raise ValueError("verify_widths need draft_length (which width a round needs)")

  @property
  def widths(self) -> tuple[int, ...]:
    """Every width the engine may verify, increasing; the last is K."""
    return tuple(self.verify_widths) + (self.num_draft,)


def check_proposal(drafter: ChainDrafter, draft_BxK, draft_logits, batch: int, *,
                   sampled: bool) -> None:
  """At trace time (shapes are static): propose's result must be what the engine reads, so a
  custom drafter's mistake is named here, not met as a broadcasting error in a verifier."""
  want = (batch, drafter.num_draft)
  if tuple(draft_BxK.shape) != want or not jnp.issubdtype(draft_BxK.dtype, jnp.integer):
    raise ValueError(f"drafter {drafter.name!r}: propose returned draft tokens "
                     f"{draft_BxK.dtype}{list(draft_BxK.shape)}, the engine needs int"
                     f"{list(want)} (rows, K = num_draft)")
  want = (batch, drafter.num_draft, drafter.vocab_size)
  if sampled and (draft_logits is None or tuple(draft_logits.shape) != want):
    got = None if draft_logits is None else list(draft_logits.shape)
    raise ValueError(f"drafter {drafter.name!r}: rule 'sample' reads the draft distribution, so "
                     f"propose must return draft logits float{list(want)}, got {got}")


# A drafter is a static argument of the decode loop, compared by identity: jit compiles one
# loop per drafter object. So a factory returns the same drafter for the same model functions
# and settings, and a caller that builds its drafter per request (a server handler, a sweep)
# reuses the compiled loop instead of compiling it again, seconds each time. A drafter holds
# only functions and settings (its weights are the params argument), so keeping a few is cheap.
DRAFTERS_KEPT = 64


def lm_chain_drafter(fns: LanguageModelFns, num_draft: int) -> ChainDrafter:
  """A drafter that runs a language model autoregressively for K tokens (its own KV cache).

  Built once per (fns, K): calling it again returns the same drafter (DRAFTERS_KEPT)."""
  if not isinstance(fns, LanguageModelFns):
    raise TypeError(f"lm_chain_drafter needs a LanguageModelFns (models.lm_fns.decoder_fns), "
                    f"got {type(fns).__name__}")
  return _lm_chain_drafter(fns, check_positive_int("K (draft block length)", num_draft))


@functools.lru_cache(maxsize=DRAFTERS_KEPT)
def _lm_chain_drafter(fns: LanguageModelFns, num_draft: int) -> ChainDrafter:
  def prefill(params, prompt_BxT, lengths_B, capacity):
    cache = fns.init_cache(prompt_BxT.shape[0], capacity)
    _, _, cache = fns.prefill(params, prompt_BxT, lengths_B, cache)
    return cache

  def propose(params, cache, recent_Bx2, positions_Bx2, rng, sampling: Filters,
              edits: DraftLogitEdits | None = None):
    logits_Bx2xV, _, cache = fns.forward(params, recent_Bx2, positions_Bx2, cache)
    keys = split_keys(rng, num_draft)
    first_logits_BxV = logits_Bx2xV[:, 1]
    if edits is not None:
      first_logits_BxV = edits.apply(first_logits_BxV)
    first_B = select_token(first_logits_BxV, keys[0], sampling)

    def step(carry, key):
      token_B, position_B, cache, edits = carry
      logits_Bx1xV, _, cache = fns.forward(params, token_B[:, None], position_B[:, None], cache)
      logits_BxV = logits_Bx1xV[:, 0]
      if edits is not None:  # the draft so far counts as output
        edits = edits.after(token_B)
        logits_BxV = edits.apply(logits_BxV)
      nxt_B = select_token(logits_BxV, key, sampling)
      out = (nxt_B, None if sampling.greedy else logits_BxV)
      return (nxt_B, position_B + 1, cache, edits), out

    # Unrolled: a while loop inside a round costs kernel launches and a read of its condition
    # per step on a GPU, for K - 1 steps that are known when tracing.
    (_, _, cache, _), (rest_KxB, rest_logits) = jax.lax.scan(
        step, (first_B, positions_Bx2[:, 1] + 1, cache, edits), keys[1:], unroll=True)
    draft_BxK = jnp.concatenate([first_B[:, None], rest_KxB.T], axis=1)
    draft_logits = None
    if not sampling.greedy:
      draft_logits = jnp.concatenate(
          [first_logits_BxV[:, None], jnp.moveaxis(rest_logits, 0, 1)], axis=1)
    return draft_BxK, draft_logits, cache

  return ChainDrafter(prefill=prefill, propose=propose, num_draft=num_draft,
                      vocab_size=fns.vocab_size, name=fns.name, param_shapes=fns.param_shapes,
                      max_positions=fns.max_positions, takes_logit_edits=True)
