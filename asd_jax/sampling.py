"""Token selection for plain decoding: greedy, temperature, min-p, top-k and top-p (nucleus);
the request's settings (SamplingConfig), repetition/presence/frequency penalties included.

Shape notation: B rows, V vocab.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from asd_jax.greedy_verify import first_argmax
from asd_jax.bad_words import check_bad_words_ids
from asd_jax.logit_edits import (LogitEdits, check_allowed_token_ids, check_logit_bias,
                                 check_min_tokens, check_penalties)
from asd_jax.sampling_keys import categorical_rows
from asd_jax.token_guide import TokenGuide
from asd_jax.spec_sampling import Filters, filtered_probs, check_filters


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """Sampling settings, checked. temperature == 0 means greedy (argmax, first max on ties).

  The decode engines compile for which filters are on (greedy or not, min-p on, top-k on,
  top-p on) and take the values as traced scalars (`filters()`), so requests at other
  temperatures, min-p, top-k or top-p reuse one compiled program. The filters apply in that
  order (`apply_sampling_filters`). A filter with temperature 0 is refused: greedy decoding
  takes the argmax, so it would do nothing.

  logit_bias, repetition_penalty, presence_penalty, frequency_penalty, min_tokens,
  allowed_token_ids, bad_words_ids and a guide (structured output) (asd_jax/logit_edits.py)
  apply before all of it, in greedy decoding too; traced like the filters.
  """

  temperature: float = 0.0
  top_k: int = 0  # 0 = off
  top_p: float = 1.0  # 1.0 = off
  min_p: float = 0.0  # 0.0 = off; keeps the tokens with p >= min_p * the top token's p
  repetition_penalty: float = 1.0  # 1.0 = off; > 1 discourages tokens of the prompt and output
  presence_penalty: float = 0.0  # 0.0 = off; in [-2, 2], subtracted once a token is output
  frequency_penalty: float = 0.0  # 0.0 = off; in [-2, 2], times the token's output count
  # 0 = off; EOS cannot end an answer (nor a stop string) before it has this many tokens
  min_tokens: int = 0
  # {token id: bias in [-100, 100]} added to the logits (stored as sorted (id, bias) pairs)
  logit_bias: tuple = ()
  # None = every token; else only these ids may be generated (stored sorted, as a tuple)
  allowed_token_ids: tuple | None = None
  # token sequences the answer may not hold (vLLM's bad_words as token ids; asd_jax/bad_words.py;
  # models.tokenizer.bad_words_ids makes them from text); stored sorted, as tuples
  bad_words_ids: tuple = ()
  # structured output: every answer is a whole match of this grammar (asd_jax/token_guide.py;
  # vLLM's guided_regex / guided_json / guided_choice); None = any text
  guide: TokenGuide | None = None

  def __post_init__(self):
    if self.guide is not None and not isinstance(self.guide, TokenGuide):
      raise TypeError(f"guide must be a TokenGuide (asd_jax.token_guide), got "
                      f"{type(self.guide).__name__}")
    object.__setattr__(self, "bad_words_ids", check_bad_words_ids(self.bad_words_ids))
    object.__setattr__(self, "min_tokens", check_min_tokens(self.min_tokens))
    object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))
    object.__setattr__(self, "allowed_token_ids",
                       check_allowed_token_ids(self.allowed_token_ids))
    penalties = check_penalties(self.repetition_penalty, self.presence_penalty,
                                self.frequency_penalty)
    for name, value in zip(("repetition_penalty", "presence_penalty", "frequency_penalty"),
                           penalties):
      object.__setattr__(self, name, value)
    # The one check shared with the sampling rules: non-numbers, NaN and out-of-range values
    # are refused with a message naming the field.
    values = check_filters(self.temperature, self.top_k, self.top_p, self.min_p)
    for name, value in zip(("temperature", "top_k", "top_p", "min_p"), values):
      object.__setattr__(self, name, value)
    filters = self.filters()  # its use_* flags are the one place that says when one is on
    on = [f"{name}={getattr(self, name)!r}" for name, used in (
        ("top_k", filters.use_top_k), ("top_p", filters.use_top_p),
        ("min_p", filters.use_min_p)) if used]
    if self.greedy and on:
      verb = "filter" if len(on) > 1 else "filters"
      raise ValueError(f"{' and '.join(on)} {verb} sampling, but temperature 0 is greedy "
                       "decoding (the argmax), which it would not change; set a temperature "
                       "> 0 or drop it")

  @property
  def greedy(self) -> bool:
    return self.temperature == 0.0

  def filters(self) -> Filters:
    """The traced form the engines, drafters and rules compute with."""
    return Filters.of(self.temperature, self.top_k, self.top_p, self.min_p)

  def logit_edits(self, vocab_size: int | None = None, eos_ids=(),
                  max_new_tokens: int | None = None) -> LogitEdits:
    """The traced form of the edits the engines apply to the target's logits, for a model of
    vocab_size tokens (the logit_bias ids are checked against it) whose answers end at eos_ids
    (min_tokens holds those back), in a request of max_new_tokens."""
    return LogitEdits.of(self.repetition_penalty, self.presence_penalty, self.frequency_penalty,
                         min_tokens=self.min_tokens, eos_ids=eos_ids, logit_bias=self.logit_bias,
                         allowed_token_ids=self.allowed_token_ids,
                         bad_words_ids=self.bad_words_ids, guide=self.guide,
                         vocab_size=vocab_size,
                         max_new_tokens=max_new_tokens)


@dataclasses.dataclass(frozen=True)
class RowSampling:
  """A decode call whose rows sample differently (a server's batch of requests): one
  SamplingConfig per row, read by the engines as they read one SamplingConfig. Its Filters and
  LogitEdits hold a value per row (Filters.of_rows, LogitEdits.of_rows): each row decodes as it
  would alone with its own settings; a filter or edit runs for the batch when any row uses it.
  Made by `sampling_for_rows`."""

  rows: tuple[SamplingConfig, ...]

  @property
  def greedy(self) -> bool:
    """Every row greedy (the greedy rules need it; with some rows sampled, rule "sample")."""
    return all(row.greedy for row in self.rows)

  @property
  def temperature(self) -> float:
    """The first sampled row's temperature (what an error about a greedy rule names)."""
    return next((row.temperature for row in self.rows if not row.greedy), 0.0)

  @property
  def min_tokens(self) -> tuple[int, ...]:
    return tuple(row.min_tokens for row in self.rows)

  def filters(self) -> Filters:
    return Filters.of_rows([row.filters() for row in self.rows])

  def logit_edits(self, vocab_size: int | None = None, eos_ids=(),
                  max_new_tokens: int | None = None) -> LogitEdits:
    return LogitEdits.of_rows([row.logit_edits(vocab_size, eos_ids, max_new_tokens)
                               for row in self.rows])


def sampling_for_rows(sampling, batch: int | None = None) -> SamplingConfig | RowSampling:
  """The engines' `sampling` argument, checked: one SamplingConfig for every row, or a list
  (or tuple) with one per row (checked against `batch` when given). A list whose rows are all
  equal is that one SamplingConfig, so it runs the program one setting runs."""
  if isinstance(sampling, (SamplingConfig, RowSampling)):
    rows = sampling.rows if isinstance(sampling, RowSampling) else None
  elif isinstance(sampling, (list, tuple)):
    rows = tuple(sampling)
    for i, row in enumerate(rows):
      if not isinstance(row, SamplingConfig):
        raise TypeError(f"sampling[{i}] must be a SamplingConfig, got {type(row).__name__}")
    if not rows:
      raise ValueError("sampling is an empty list; give one SamplingConfig per prompt row")
  else:
    raise TypeError(f"sampling must be a SamplingConfig or a list with one SamplingConfig per "
                    f"prompt row, got {type(sampling).__name__}")
  if rows is None:
    return sampling
  if batch is not None and len(rows) != batch:
    raise ValueError(f"sampling has {len(rows)} SamplingConfigs for {batch} prompt rows; give "
                     "one per row, or one SamplingConfig for all")
  return rows[0] if all(row == rows[0] for row in rows) else RowSampling(rows)


def probabilities(logits_BxV: jax.Array, cfg: SamplingConfig | Filters) -> jax.Array:
  """float32[B, V]: the distribution a sampler with `cfg` draws from (one-hot when greedy).

  The one filter implementation shared with speculative sampling (spec_sampling), so plain
  and speculative sampling target exactly the same distribution.
  """
  return filtered_probs(logits_BxV, cfg if isinstance(cfg, Filters) else cfg.filters())


def select_token(logits_BxV: jax.Array, rng: jax.Array,
                 cfg: SamplingConfig | Filters) -> jax.Array:
  """int32[B]: argmax when greedy, else a sample from the filtered distribution.

  rng: one key, or a key per row [B] (row b then draws from rng[b] only).
  """
  if cfg.greedy:
    return first_argmax(logits_BxV)[0]  # == jnp.argmax, without XLA:CPU's slow argmax path
  return categorical_rows(rng, jnp.log(probabilities(logits_BxV, cfg)))
