"""What a request does to the target's logits before it samples: vLLM's and OpenAI's
`logit_bias`, `min_tokens`, `allowed_token_ids`, `bad_words`, the repetition, presence and
frequency penalties, and structured output (guided decoding).

For each token, with count = how many times it is in the output so far, in this order:
  logit_bias b_t (OpenAI; vLLM): z += b_t for the tokens the request names;
  repetition_penalty r (CTRL, Keskar et al. 2019; transformers; vLLM): a token in the prompt or
    the output has its logit z divided by r where z > 0 and multiplied by r otherwise, so
    r > 1 makes every seen token less likely and r < 1 more likely;
  frequency_penalty f: z -= f * count;
  presence_penalty p: z -= p where count > 0;
  min_tokens m: while the output holds fewer than m tokens, the EOS ids get z = -inf (so no
    rule can choose, accept or sample one);
  allowed_token_ids (vLLM): every other token gets z = -inf;
  bad words (vLLM's bad_words, as token sequences): a token that would complete one gets
    z = -inf (asd_jax/bad_words.py);
  a guide (structured output: asd_jax/token_guide.py): a token the grammar does not allow next
    gets z = -inf.
On the target's raw logits, before temperature and the sampling filters. Unlike the filters
they change what greedy decoding picks, so they apply at temperature 0 too.

Every engine applies them where the target's logits choose or verify a token: plain decoding
with the output so far; a speculative round's row for draft position j with the committed
output plus the drafted tokens before j (a chain) or the node's ancestors (a tree) -- the
context that position has if the draft is accepted (its tokens count, and its length is what
min_tokens reads). So strict verification still gives plain greedy decoding's output under the
same settings, and speculative sampling stays lossless. Language-model chain and tree drafters
and EAGLE-3 draft under them too (`DraftLogitEdits`; a tree node's children with its path as
context); Medusa and the n-gram drafters propose as they would without them, which costs
acceptance only, since every proposal is verified. Log-probabilities stay the model's raw ones,
as vLLM reports by default.

Shapes: B rows, R logits rows per row (1, K+1 or N+1), J context tokens per logits row, V vocab.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from asd_jax import bad_words, token_guide

_FLOAT32_MAX = float(np.finfo(np.float32).max)
PRESENCE_FREQUENCY_RANGE = 2.0  # vLLM and OpenAI accept [-2, 2]
LOGIT_BIAS_RANGE = 100.0  # OpenAI accepts [-100, 100]: -100 bans a token in practice


def check_penalties(repetition, presence, frequency) -> tuple[float, float, float]:
  """Validates penalty settings; returns them as floats. Raises ValueError."""
  if isinstance(repetition, bool) or not isinstance(repetition, numbers.Real) or not (
      math.isfinite(repetition) and repetition > 0):
    raise ValueError(f"repetition_penalty must be a finite number > 0 (1 = off), "
                     f"got {repetition!r}")
  for name, value in (("presence_penalty", presence), ("frequency_penalty", frequency)):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
        -PRESENCE_FREQUENCY_RANGE <= value <= PRESENCE_FREQUENCY_RANGE):
      raise ValueError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}")
  return float(repetition), float(presence), float(frequency)


def check_min_tokens(min_tokens) -> int:
  """Validates min_tokens (an int >= 0; 0 = off); returns it. Raises ValueError."""
  if isinstance(min_tokens, bool) or not isinstance(min_tokens, numbers.Integral) or (
      min_tokens < 0):
    raise ValueError(f"min_tokens must be an integer >= 0 (0 = off), got {min_tokens!r}")
  return int(min_tokens)


def check_min_tokens_fit(min_tokens: int, max_new_tokens: int) -> None:
  """A min_tokens above the request's max_new_tokens is refused, as vLLM refuses one above
  max_tokens: no answer could have that many tokens."""
  if min_tokens > max_new_tokens:
    raise ValueError(f"min_tokens ({min_tokens}) is more than max_new_tokens "
                     f"({max_new_tokens}): no answer could have that many tokens")


def check_allowed_token_ids(allowed) -> tuple[int, ...] | None:
  """Validates allowed_token_ids (None = every token; else token ids >= 0, at least one);
  returns them sorted, without repeats. Raises ValueError."""
  if allowed is None:
    return None
  if isinstance(allowed, (str, bytes, dict)) or not hasattr(allowed, "__iter__"):
    raise ValueError(f"allowed_token_ids must be a list of token ids, got {allowed!r}")
  ids = list(allowed)
  bad = [t for t in ids
         if isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0]
  if bad:
    raise ValueError(f"allowed_token_ids: a token id must be an integer >= 0, got {bad[0]!r}")
  if not ids:
    raise ValueError("allowed_token_ids is empty: no token could be generated (None allows "
                     "every token)")
  return tuple(sorted(set(map(int, ids))))


def check_logit_bias(logit_bias) -> tuple[tuple[int, float], ...]:
  """Validates a logit bias ({token id: bias} or (id, bias) pairs; ids >= 0, biases in
  [-100, 100]); returns it as sorted (id, bias) pairs. Raises ValueError. Ids are checked
  against the vocabulary where it is known (`LogitEdits.of`)."""
  pairs = logit_bias.items() if isinstance(logit_bias, dict) else logit_bias
  try:
    pairs = [tuple(pair) for pair in pairs]
  except TypeError:
    raise ValueError(f"logit_bias must map token ids to biases ({{id: bias}}), got "
                     f"{logit_bias!r}") from None
  seen = {}
  for pair in pairs:
    if len(pair) != 2:
      raise ValueError(f"logit_bias must map token ids to biases, got the entry {pair!r}")
    token, bias = pair
    if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
      raise ValueError(f"logit_bias: a token id must be an integer >= 0, got {token!r}")
    if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not (
        -LOGIT_BIAS_RANGE <= bias <= LOGIT_BIAS_RANGE):
      raise ValueError(f"logit_bias: the bias of token {token} must be a number in "
                       f"[-100, 100], got {bias!r}")
    if int(token) in seen:
      raise ValueError(f"logit_bias names token {token} twice")
    seen[int(token)] = float(bias)
  return tuple(sorted(seen.items()))


@flax.struct.dataclass
class LogitEdits:
  """The request's logit edits as the engines compute with them: the values are traced (new
  values reuse the compiled program); which edits are on is static (all off, the engines carry
  no token counts and compute nothing). Build one with `LogitEdits.of` (checked) or
  SamplingConfig.logit_edits(vocab_size, eos_ids)."""

  # Each value is one request's (a scalar, bias_V and allowed_V [V]) or one per row of the
  # batch (a leading [B] axis; `of_rows`).
  repetition: Any  # float32 scalar
  presence: Any  # float32 scalar
  frequency: Any  # float32 scalar
  min_tokens: Any  # int32 scalar
  bias_V: Any = None  # float32[V] added to the logits; None: no logit_bias
  allowed_V: Any = None  # bool[V], the tokens the request may generate; None: all
  # int32[N, W] and [N]: the bad words' prefixes and last tokens (bad_words.pack); None: none
  bad_prefix_NxW: Any = None
  bad_last_N: Any = None
  # int32[S, V] and a scalar (or [B]): a guide's table and start state (token_guide.device_table
  # / stack_rows); None: no guide
  guide_SxV: Any = None
  guide_start: Any = None
  # A repetition, presence or frequency penalty is on (the engines then count the tokens).
  counts_tokens: bool = flax.struct.field(pytree_node=False, default=False)
  # The ids min_tokens holds back; () when min_tokens is 0 or the request has no EOS ids.
  banned_until_min: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())
  # bool[B, E]: which of banned_until_min each row ends at, when rows end at different ids
  # (for_eos_rows); None: every row at all of them.
  banned_rows_BxE: Any = None

  @property
  def on(self) -> bool:
    return (self.counts_tokens or bool(self.banned_until_min) or self.bias_V is not None
            or self.allowed_V is not None or self.bad_last_N is not None
            or self.guide_SxV is not None)

  @property
  def tail_width(self) -> int:
    """How many of the answer's last tokens the bad words' prefixes are matched against."""
    return 0 if self.bad_prefix_NxW is None else np.shape(self.bad_prefix_NxW)[-1]

  @classmethod
  def of(cls, repetition=1.0, presence=0.0, frequency=0.0, *, min_tokens=0, eos_ids=(),
         logit_bias=(), allowed_token_ids=None, bad_words_ids=(), guide=None,
         vocab_size: int | None = None, max_new_tokens: int | None = None) -> "LogitEdits":
    """Checked settings. eos_ids: the ids that end an answer (min_tokens holds them back);
    vocab_size: needed with a logit_bias, allowed_token_ids, bad_words_ids or a guide (their
    ids are checked against it); guide: a token_guide.TokenGuide, or None; max_new_tokens:
    the request's (a min_tokens above it is refused, as vLLM refuses one above max_tokens)."""
    repetition, presence, frequency = check_penalties(repetition, presence, frequency)
    min_tokens = check_min_tokens(min_tokens)
    if max_new_tokens is not None:
      check_min_tokens_fit(min_tokens, max_new_tokens)
    bias_V = None
    pairs = check_logit_bias(logit_bias)
    if pairs:
      if vocab_size is None:
        raise ValueError("a logit_bias needs the vocabulary size")
      out = [token for token, _ in pairs if token >= vocab_size]
      if out:
        raise ValueError(f"logit_bias names token id(s) {out[:5]} outside the vocabulary "
                         f"[0, {vocab_size})")
      bias_V = np.zeros(vocab_size, np.float32)
      bias_V[[t for t, _ in pairs]] = [b for _, b in pairs]
    bad_prefix_NxW = bad_last_N = None
    words = bad_words.check_bad_words_ids(bad_words_ids)
    if words:
      if vocab_size is None:
        raise ValueError("bad_words_ids needs the vocabulary size")
      bad_prefix_NxW, bad_last_N = bad_words.pack(words, vocab_size)
    allowed_V = None
    allowed = check_allowed_token_ids(allowed_token_ids)
    if allowed is not None:
      if vocab_size is None:
        raise ValueError("allowed_token_ids needs the vocabulary size")
      if allowed[-1] >= vocab_size:
        raise ValueError(f"allowed_token_ids names token id {allowed[-1]} outside the "
                         f"vocabulary [0, {vocab_size})")
      # The allowed ids no bad word ever bans: without one, an answer could reach a point
      # where every allowed id completes a bad word, and no token could follow.
      never_banned = set(allowed) - {word[-1] for word in words}
      if not never_banned:
        raise ValueError("every one of allowed_token_ids ends a bad word (bad_words_ids), so an "
                         "answer could reach a point where no token may follow")
      if min_tokens and eos_ids and never_banned <= set(map(int, eos_ids)):
        raise ValueError("allowed_token_ids holds only EOS ids, which min_tokens holds back"
                         + (", besides ids that end a bad word" if words else "")
                         + ": no token could be generated before min_tokens")
      allowed_V = np.zeros(vocab_size, bool)
      allowed_V[list(allowed)] = True
    guide_SxV = guide_start = None
    if guide is not None:
      guide_SxV, guide_start = _guide_table(guide, eos_ids, vocab_size, min_tokens=min_tokens,
                                            allowed=allowed, words=words)
    return cls(np.float32(repetition), np.float32(presence), np.float32(frequency),
               np.int32(min_tokens), bias_V, allowed_V, bad_prefix_NxW, bad_last_N,
               guide_SxV, guide_start,
               counts_tokens=(repetition, presence, frequency) != (1.0, 0.0, 0.0),
               banned_until_min=tuple(map(int, eos_ids)) if min_tokens else ())

  @classmethod
  def of_rows(cls, rows: list["LogitEdits"]) -> "LogitEdits":
    """One request's LogitEdits per row (each built with `of`, so checked; one decode call, so
    the same EOS ids) as one whose values are per row: repetition, presence, frequency and
    min_tokens [B], bias_V and allowed_V [B, V], the bad words [B, N, W] and [B, N]. An edit is
    on when any row's is; a row without it gets the neutral value (penalty 1 / 0, bias 0,
    min_tokens 0, every id allowed, no bad words), which leaves its logits exactly as they
    are."""
    if not rows:
      raise ValueError("per-row logit edits need at least one row")
    if not any(row.on for row in rows):
      return rows[0]
    held_back = {row.banned_until_min for row in rows if row.banned_until_min}
    if len(held_back) > 1:
      raise ValueError(f"the rows of one decode call hold back different EOS ids {held_back}")

    def stack(name, neutral):
      if all(getattr(row, name) is None for row in rows):
        return None
      vocab = next(getattr(row, name) for row in rows if getattr(row, name) is not None).size
      return np.stack([np.full(vocab, neutral) if getattr(row, name) is None
                       else np.asarray(getattr(row, name)) for row in rows])

    guide_SxV = guide_start = None
    if any(row.guide_SxV is not None for row in rows):
      guide_SxV, guide_start = token_guide.stack_rows(
          [None if row.guide_SxV is None else (row.guide_SxV, row.guide_start) for row in rows])
    bad_prefix = bad_last = None
    if any(row.bad_last_N is not None for row in rows):
      bad_prefix, bad_last = bad_words.pad_rows(
          [None if row.bad_last_N is None else (row.bad_prefix_NxW, row.bad_last_N)
           for row in rows])
    return cls(*(np.stack([np.asarray(getattr(row, name)) for row in rows])
                 for name in ("repetition", "presence", "frequency", "min_tokens")),
               bias_V=stack("bias_V", np.float32(0)), allowed_V=stack("allowed_V", True),
               bad_prefix_NxW=bad_prefix, bad_last_N=bad_last, guide_SxV=guide_SxV,
               guide_start=guide_start,
               counts_tokens=any(row.counts_tokens for row in rows),
               banned_until_min=held_back.pop() if held_back else ())


OFF = LogitEdits.of()


def _guide_table(guide, eos_ids, vocab_size, *, min_tokens, allowed, words):
  """A guide's checked device table (token_guide.device_table)."""
  if not isinstance(guide, token_guide.TokenGuide):
    raise TypeError(f"guide must be a TokenGuide (asd_jax.token_guide), got "
                    f"{type(guide).__name__}")
  if vocab_size is None:
    raise ValueError("a guide needs the vocabulary size")
  if guide.vocab_size != vocab_size:
    raise ValueError(f"the guide was built for a vocabulary of {guide.vocab_size} tokens; this "
                     f"model has {vocab_size}")
  if not eos_ids:
    raise ValueError("structured output ends an answer at an EOS id once it is a whole match, "
                     "and this request has none (ignore_eos?): give it one")
  # Each of these could leave a state with no token to choose (the grammar's only ways on
  # banned): refused rather than decoded into a dead end.
  for name, on in (("min_tokens", min_tokens), ("allowed_token_ids", allowed is not None),
                   ("bad_words_ids", bool(words))):
    if on:
      raise ValueError(f"structured output (a guide) with {name} is not supported: together "
                       "they could leave no token the answer may take")
  return token_guide.device_table(guide, tuple(map(int, eos_ids)))


def for_eos_rows(edits: LogitEdits, eos_rows_BxE) -> LogitEdits:
  """`edits` for a decode call whose rows end at different ids (eos_rows_BxE[b, e]: row b ends
  at the e-th of the ids the edits were built with; request_checks.check_row_eos_ids):
  min_tokens then holds back each row's own ids only. Unchanged when eos_rows_BxE is None or
  min_tokens holds nothing back."""
  if eos_rows_BxE is None or not edits.banned_until_min:
    return edits
  return edits.replace(banned_rows_BxE=eos_rows_BxE)


@flax.struct.dataclass
class TokenCounts:
  """What the edits read, per row: output_length_B, the output's length (min_tokens); when
  a penalty counts tokens, output_BxV, how many times each token is in the output, and
  in_prompt_BxV, whether it is in the prompt (else None); when a bad word is longer than one
  token, tail_BxW, the output's last W tokens, -1 where it is shorter (else None)."""

  output_length_B: jax.Array
  output_BxV: jax.Array | None = None
  in_prompt_BxV: jax.Array | None = None
  tail_BxW: jax.Array | None = None
  guide_state_B: jax.Array | None = None  # with a guide: the state the output leaves it in


def count_prompt(prompt_BxT, lengths_B, vocab: int, edits: LogitEdits) -> TokenCounts | None:
  """Counts for a request before its first token: the prompt's tokens (padding excluded);
  None when the request edits no logits."""
  if not edits.on:
    return None
  b, t = prompt_BxT.shape
  counts = TokenCounts(output_length_B=jnp.zeros((b,), jnp.int32))
  if edits.tail_width:
    counts = counts.replace(tail_BxW=jnp.full((b, edits.tail_width), -1, jnp.int32))
  if edits.guide_SxV is not None:
    counts = counts.replace(guide_state_B=jnp.broadcast_to(
        jnp.asarray(edits.guide_start, jnp.int32), (b,)))
  if not edits.counts_tokens:
    return counts
  real_BxT = jnp.arange(t)[None] < lengths_B[:, None]
  ids_BxT = jnp.where(real_BxT, prompt_BxT, vocab)  # vocab = out of bounds: dropped
  in_prompt_BxV = jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], ids_BxT].set(
      True, mode="drop")
  return counts.replace(output_BxV=jnp.zeros((b, vocab), jnp.int32), in_prompt_BxV=in_prompt_BxV)


def add_output(counts: TokenCounts | None, tokens_BxJ, keep_BxJ,
               edits: LogitEdits | None = None) -> TokenCounts | None:
  """Counts after appending tokens_BxJ[keep_BxJ] to each row's output (None stays None);
  keep_BxJ is a prefix of each row (the tokens a round commits). edits: the request's, needed
  with a guide (its table moves the state)."""
  if counts is None:
    return None
  if counts.guide_state_B is not None:
    if edits is None or edits.guide_SxV is None:
      raise ValueError("add_output: the counts follow a guide; pass the request's edits")
    counts = counts.replace(guide_state_B=token_guide.walk(
        jnp.asarray(edits.guide_SxV), counts.guide_state_B, tokens_BxJ, keep_BxJ))
  counts = counts.replace(output_length_B=counts.output_length_B
                          + keep_BxJ.sum(axis=1, dtype=jnp.int32))
  if counts.tail_BxW is not None:
    counts = counts.replace(tail_BxW=bad_words.append_tail(counts.tail_BxW, tokens_BxJ,
                                                           keep_BxJ))
  if counts.output_BxV is None:
    return counts
  b, vocab = counts.output_BxV.shape
  ids_BxJ = jnp.where(keep_BxJ, tokens_BxJ, vocab)
  output_BxV = counts.output_BxV.at[jnp.arange(b)[:, None], ids_BxJ].add(1, mode="drop")
  return counts.replace(output_BxV=output_BxV)


@flax.struct.dataclass
class DraftLogitEdits:
  """What a drafter that drafts under the request's logit edits reads
  (ChainDrafter / TreeDrafter.takes_logit_edits): the committed output's counts and the
  request's settings. A drafter that picks what the target picks then still does under them
  (the target drafting for itself accepts every draft, tests/test_penalties.py,
  test_logit_edits.py); a distilled one gained little from drafting under a penalty
  (scripts/penalty_tau.py), an EAGLE-3 tree a lot under a structured-output guide
  (scripts/guided_speed.py)."""

  counts: TokenCounts
  edits: LogitEdits

  def apply(self, logits_BxV):
    """The edited logits the next draft token is chosen from."""
    return edit_logits(logits_BxV, self.counts, self.edits)

  def after(self, token_B) -> "DraftLogitEdits":
    """The same, with token_B drafted (counted as output for the draft tokens after it)."""
    return self.replace(counts=add_output(self.counts, token_B[:, None],
                                          jnp.ones(token_B.shape + (1,), bool), self.edits))


def chain_context(draft_BxK):
  """int32[B, K+1, K]: logits row j's drafted context, draft[:j] (-1 = no token)."""
  k = draft_BxK.shape[1]
  before_K1xK = jnp.arange(k)[None] < jnp.arange(k + 1)[:, None]
  return jnp.where(before_K1xK[None], draft_BxK[:, None, :], -1)


def tree_context(tokens_BxN, paths_BxNxD):
  """int32[B, N+1, D]: logits row 0 (the root's) has no drafted context, row n+1 node n's
  path from the root, node n included (paths as tree_verify.tree_paths gives, -1 padded)."""
  b, _, d = paths_BxNxD.shape
  on_path = paths_BxNxD >= 0
  path_tokens_BxNxD = jnp.where(on_path, jnp.take_along_axis(
      tokens_BxN[:, :, None], jnp.maximum(paths_BxNxD, 0), axis=1), -1)
  return jnp.concatenate([jnp.full((b, 1, d), -1, jnp.int32), path_tokens_BxNxD], axis=1)


def edit_logits(logits, counts: TokenCounts | None, edits: LogitEdits, context_BxRxJ=None):
  """float32 logits [B, V] or [B, R, V] after the request's edits (the input unchanged when
  they are off). Row r of [B, R, V] also counts context_BxRxJ[:, r]'s tokens (-1 = none) as
  output.

  Non-finite logits pass through unchanged, so the engines' NaN/inf checks still see them; a
  finite logit a penalty would push past float32's range saturates at its largest value
  instead (r = 1e-38 would make a logit of 4 infinite, and softmax NaN).
  """
  if not edits.on:
    return logits
  z = logits.astype(jnp.float32)
  rows = z.ndim == 3
  z_BxRxV = z if rows else z[:, None]
  b, r, vocab = z_BxRxV.shape

  def per_row(value, dtype, trailing: int):
    """A value of one request (`trailing` dims: 0 for a scalar, 1 for [V]) as it is; one per
    row ([B] + trailing) with the logits row axis R inserted after B."""
    value = jnp.asarray(value, dtype)
    return value if value.ndim == trailing else jnp.expand_dims(value, 1 if trailing else (1, 2))

  out = z_BxRxV
  if edits.bias_V is not None:
    out = out + per_row(edits.bias_V, jnp.float32, 1)
  if edits.counts_tokens:
    output_BxRxV = jnp.broadcast_to(counts.output_BxV[:, None], (b, r, vocab))
    if context_BxRxJ is not None:
      ids_BxRxJ = jnp.where(context_BxRxJ >= 0, context_BxRxJ, vocab)
      output_BxRxV = output_BxRxV.at[jnp.arange(b)[:, None, None],
                                     jnp.arange(r)[None, :, None], ids_BxRxJ].add(1, mode="drop")
    in_output = output_BxRxV > 0
    seen = in_output | counts.in_prompt_BxV[:, None]
    repetition = per_row(edits.repetition, jnp.float32, 0)
    out = jnp.where(seen, jnp.where(out > 0, out / repetition, out * repetition), out)
    out = (out - per_row(edits.frequency, jnp.float32, 0) * output_BxRxV
           - per_row(edits.presence, jnp.float32, 0) * in_output)
  finite = jnp.isfinite(z_BxRxV)
  out = jnp.where(finite, jnp.clip(out, -_FLOAT32_MAX, _FLOAT32_MAX), z_BxRxV)
  if edits.banned_until_min:
    # Row r chooses output token number length + (its drafted context's length).
    drafted_BxR = 0 if context_BxRxJ is None else (context_BxRxJ >= 0).sum(-1, dtype=jnp.int32)
    min_tokens = jnp.asarray(edits.min_tokens)
    early_BxR = counts.output_length_B[:, None] + drafted_BxR < (
        min_tokens[:, None] if min_tokens.ndim else min_tokens)
    ids_E = jnp.asarray(edits.banned_until_min)
    if edits.banned_rows_BxE is None:
      banned = jnp.zeros((vocab,), bool).at[ids_E].set(True, mode="drop")
    else:  # each row's own ids, [B, 1, V]
      banned = jnp.zeros((b, vocab), bool).at[jnp.arange(b)[:, None], ids_E[None]].set(
          jnp.asarray(edits.banned_rows_BxE), mode="drop")[:, None]
    out = jnp.where(early_BxR[:, :, None] & banned & finite, -jnp.inf, out)
  if edits.allowed_V is not None:
    out = jnp.where(~per_row(edits.allowed_V, bool, 1) & finite, -jnp.inf, out)
  if edits.bad_last_N is not None:
    ban_BxRxV = bad_words.banned(b, r, vocab, counts.tail_BxW, edits.bad_prefix_NxW,
                                 edits.bad_last_N, context_BxRxJ)
    out = jnp.where(ban_BxRxV & finite, -jnp.inf, out)
  if edits.guide_SxV is not None:
    table_SxV = jnp.asarray(edits.guide_SxV)
    state_BxR = jnp.broadcast_to(counts.guide_state_B[:, None], (b, r))
    if context_BxRxJ is not None:
      state_BxR = token_guide.walk(table_SxV, state_BxR, context_BxRxJ, context_BxRxJ >= 0)
    out = jnp.where((jnp.take(table_SxV, state_BxR, axis=0) < 0) & finite, -jnp.inf, out)
  return out if rows else out[:, 0]
