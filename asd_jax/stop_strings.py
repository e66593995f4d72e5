"""Stop strings: a row ends once its generated text contains one of them (vLLM's `stop`).

Text exists only on the host (the tokenizer is Python), while the engines run a whole request as
one `lax.while_loop`. So the check is an ordered host callback at each commit that returns, per
row, how many generated tokens to keep: all of them, or those up to the token that completes the
first stop string. A speculative round may commit several tokens past that point; they are
dropped, and the row ends. The result holds the tokens through the completing one; the text
before the stop string is `StopStrings.cut(text)` (vLLM leaves the stop string out by default).
Each row of a batch may have its own StopStrings, or none (`stop=[...]`, one per row: the
requests of a batch are independent, as vLLM's). Without any nothing is traced, so the program
without stop strings is unchanged. The callback finds the call's stop strings by the call's id
(asd_jax/host_calls.py), so other stop strings per request do not compile the loop again.

Each check decodes only a window of the row: the new tokens plus enough earlier ones to hold a
stop string that began before them (`StopStrings._window`), so a long answer is not re-decoded
every round. The callback blocks the loop while it runs, so with `completers` (which
`from_tokenizer` fills) the loop calls it only in rounds whose new tokens may complete a stop
string (asd_jax/stop_gate.py: exact, and most rounds skip it).

Shape notation: B rows, W output buffer width.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback

from asd_jax.host_calls import HostCall, host_object
from asd_jax.stop_gate import gate_table, tokenizer_completers

# Characters decoded before a window's new tokens beyond the longest stop string: a window that
# starts inside a character (byte-level BPE) or drops a leading space (SentencePiece) alters
# only its first few characters.
_BOUNDARY_CHARS = 8
# How far the window's earlier text may shrink once the new tokens complete a character it
# ended inside (one U+FFFD per byte of it).
_SLACK_CHARS = 3


@dataclasses.dataclass(frozen=True, eq=False)
class StopStrings:
  """strings: the stop strings; decode(ids) -> the text of generated token ids (as the answer
  is shown, e.g. tokenizer.decode(ids, skip_special_tokens=True): `from_tokenizer`).

  Immutable: one StopStrings may serve any number of rows and calls, at once too. Any
  StopStrings runs the same compiled program.
  """

  strings: tuple[str, ...]
  decode: Callable[[list[int]], str]
  # bool over token ids: the tokens that may complete a stop string (asd_jax/stop_gate.py); the
  # loop calls the host check only in rounds that commit one. None: every round is checked.
  # Ids at or past its length always count. from_tokenizer fills it.
  completers: np.ndarray | None = None

  def __post_init__(self):
    if isinstance(self.strings, str) or not isinstance(self.strings, tuple):
      raise TypeError(f"strings must be a tuple of str, got {type(self.strings).__name__}")
    if not self.strings:
      raise ValueError("no stop strings given; pass stop=None to decode without them")
    for s in self.strings:
      if not isinstance(s, str):
        raise TypeError(f"a stop string must be a str, got {type(s).__name__}")
      if not s:
        raise ValueError("an empty stop string would end every answer before its first token")
    if not callable(self.decode):
      raise TypeError(f"decode must be callable (ids) -> str, got {type(self.decode).__name__}")
    if self.completers is not None and not (isinstance(self.completers, np.ndarray)
                                            and self.completers.dtype == np.bool_
                                            and self.completers.ndim == 1):
      raise TypeError("completers must be a 1-D bool numpy array over token ids (or None)")

  @classmethod
  def from_tokenizer(cls, tokenizer, strings) -> StopStrings:
    """Stop strings matched in the text the tokenizer shows (special tokens skipped)."""
    stop = cls(tuple(strings), lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    # The gate is built after the checks above, so they speak first about bad strings.
    completers = tokenizer_completers(tokenizer, stop.strings)
    return dataclasses.replace(stop, completers=completers)

  def find(self, text: str, after: int = 0) -> int | None:
    """Where the earliest stop string in `text` starts, or None; with `after`, only one that
    ends past text[:after] counts (min_tokens_chars)."""
    starts = [i for i in (text.find(s, max(0, after - len(s) + 1)) for s in self.strings)
              if i >= 0]
    return min(starts) if starts else None

  def cut(self, text: str, after: int = 0, include: bool = False) -> str:
    """`text` before its first stop string (all of it without one); `after` as in find. With
    include, through the stop string (vLLM's include_stop_str_in_output): the first of those
    starting there, in `strings`' order."""
    at = self.find(text, after)
    if at is None:
      return text
    if include:
      return text[:at + next(len(s) for s in self.strings if text.startswith(s, at))]
    return text[:at]

  def settled(self, text: str, after: int = 0) -> str:
    """The part of a growing `text` that later tokens cannot cut: the text before a stop string,
    or else all but a tail that may be the start of one (a stream prints only this); `after`
    as in find."""
    at = self.find(text, after)
    if at is not None:
      return text[:at]
    held = max((k for s in self.strings for k in range(1, len(s))
                if text.endswith(s[:k])), default=0)
    return text[:len(text) - held]

  def min_tokens_chars(self, tokens: list[int], min_tokens: int) -> int:
    """How many characters of an answer's text (its generated tokens) no stop string may end
    in: those of its first min_tokens - 1 tokens, which the engines check none in (a stop
    string completed by token number min_tokens or later counts)."""
    return len(self.decode(tokens[:min_tokens - 1])) if min_tokens > 1 else 0

  def first_stop(self, tokens: list[int], before: int, min_tokens: int = 0) -> int | None:
    """The smallest n in (before, len(tokens)] whose text decode(tokens[:n]) contains a stop
    string, or None. tokens[:before] were checked already and hold none (past
    min_tokens_chars). With min_tokens, only n >= min_tokens and a stop string ending past the
    text of the first min_tokens - 1 tokens count."""
    start = max(before, min_tokens - 1)
    while start < len(tokens):
      n = self._first_stop(tokens, start)
      if n is None or min_tokens <= 1 or self.find(
          self.decode(tokens[:n]), self.min_tokens_chars(tokens, min_tokens)) is not None:
        return n
      # The window's margin saw a stop string that ends before the min_tokens-th token: look on
      # (a few tokens at most, until the margin no longer reaches it).
      start = n
    return None

  def _first_stop(self, tokens: list[int], before: int) -> int | None:
    start, old_chars = self._window(tokens, before)

    def completes_one(n: int) -> bool:
      # Only a stop string reaching into the new text counts; one earlier in the window can
      # only be an artifact of the window's first characters.
      text = self.decode(tokens[start:n])
      return any(text.find(s, max(0, old_chars - len(s) + 1 - _SLACK_CHARS)) >= 0
                 for s in self.strings)

    # Most commits complete no stop string: one decode of the whole window says so.
    if not completes_one(len(tokens)):
      return None
    return next((n for n in range(before + 1, len(tokens)) if completes_one(n)), len(tokens))

  def _window(self, tokens: list[int], before: int) -> tuple[int, int]:
    """(start, characters of decode(tokens[start:before])): a window whose text before the new
    tokens holds the longest stop string but one character, plus a margin for its first
    characters. Tokens that decode to nothing (skipped specials) or to parts of a character
    make the tokens needed unknowable in advance, so the window doubles until it is enough."""
    need = max(map(len, self.strings)) - 1 + _BOUNDARY_CHARS
    span = need
    while True:
      start = max(0, before - span)
      chars = len(self.decode(tokens[start:before]))
      if start == 0 or chars >= need:
        return start, chars
      span *= 2


@dataclasses.dataclass(frozen=True, eq=False)
class RowStops:
  """One decode call's stop strings, row by row (None: the row has none); made by row_stops."""

  rows: tuple[StopStrings | None, ...]
  # A stop string counts only when the token completing it is at least the min_tokens-th of
  # the answer (vLLM checks none before min_tokens). One for every row, or a tuple, one per row.
  min_tokens: int | tuple[int, ...] = 0
  # The first exception a `decode` raised in this call (re-raised after the loop; the check is
  # off for the rest of the call).
  _error: list = dataclasses.field(default_factory=list, init=False, repr=False)

  def gate(self) -> np.ndarray | None:
    """The loop's gate table (asd_jax/stop_gate.gate_table), None when no row has one."""
    return gate_table([False if row is None else row.completers for row in self.rows])

  def _keep(self, tokens_BxW, before_B, after_B) -> tuple[np.ndarray, np.ndarray]:
    """Host side: (tokens each row keeps, whether a stop string ended the row)."""
    keep_B = np.asarray(after_B).astype(np.int32)
    stopped_B = np.zeros(keep_B.shape, np.bool_)
    if self._error:
      return keep_B, stopped_B
    tokens_BxW, before_B = np.asarray(tokens_BxW), np.asarray(before_B)
    min_tokens_B = np.broadcast_to(np.asarray(self.min_tokens), keep_B.shape)
    try:
      for row in np.flatnonzero(keep_B > np.maximum(before_B, min_tokens_B - 1)):
        if self.rows[row] is None:
          continue
        n = self.rows[row].first_stop(tokens_BxW[row, :keep_B[row]].tolist(),
                                      int(before_B[row]), int(min_tokens_B[row]))
        if n is not None:
          keep_B[row], stopped_B[row] = n, True
    except Exception as e:  # noqa: BLE001 - re-raised by finish_host_calls, unchanged
      self._error.append(e)
    return keep_B, stopped_B


# What the engines' `stop` argument takes.
StopArg = Union[StopStrings, Sequence[Union[StopStrings, None]], None]


def row_stops(stop: StopArg, batch: int,
              min_tokens: int | tuple[int, ...] = 0) -> RowStops | None:
  """At the Python boundary of a decode call: `stop` (None, a StopStrings for every row, or a
  sequence with a StopStrings or None per row) as RowStops, None when no row has any. Anything
  else is refused here: inside the running loop it would fail as an XLA error. min_tokens: the
  request's (SamplingConfig.min_tokens), or one per row; no stop string ends an answer shorter
  than that."""
  if stop is None:
    return None
  if isinstance(stop, StopStrings):
    return RowStops((stop,) * batch, min_tokens)
  if not isinstance(stop, (list, tuple)):
    raise TypeError(f"stop must be a StopStrings or a list with one StopStrings (or None) per "
                    f"row, got {type(stop).__name__}")
  if len(stop) != batch:
    raise ValueError(f"stop has {len(stop)} entries for {batch} rows; give one StopStrings "
                     "(or None) per row, or one StopStrings for all")
  for i, row in enumerate(stop):
    if row is not None and not isinstance(row, StopStrings):
      raise TypeError(f"stop[{i}] must be a StopStrings or None, got {type(row).__name__}")
  return None if all(row is None for row in stop) else RowStops(tuple(stop), min_tokens)


def keep_until_stop(host: HostCall, tokens_BxW: jax.Array, before_B: jax.Array,
                    after_B: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Inside a jitted loop, after rows committed tokens [before_B, after_B) into tokens_BxW:
  (kept_B, stopped_B): the generated count each row keeps and whether a stop string ended it.
  Without stop strings: (after_B, all False), with nothing traced."""
  unchanged = (after_B, jnp.zeros(after_B.shape, bool))
  if not host.stop:
    return unchanged

  def check():
    shape_B = after_B.shape
    return io_callback(_keep, (jax.ShapeDtypeStruct(shape_B, jnp.int32),
                               jax.ShapeDtypeStruct(shape_B, jnp.bool_)),
                       host.call_id, tokens_BxW, before_B, after_B, ordered=True)

  gate_BxM = host.stop_gate_BxM
  if gate_BxM is None:
    return check()
  # The callback runs only when a new token may complete a stop string (asd_jax/stop_gate.py).
  cols_W = jnp.arange(tokens_BxW.shape[1])
  new_BxW = (cols_W[None] >= before_B[:, None]) & (cols_W[None] < after_B[:, None])
  ids_BxW = jnp.clip(tokens_BxW, 0, gate_BxM.shape[1] - 1)
  may_complete_BxW = jnp.take_along_axis(gate_BxM, ids_BxW, axis=1)
  return jax.lax.cond(jnp.any(new_BxW & may_complete_BxW), check, lambda: unchanged)


def _keep(call_id, tokens_BxW, before_B, after_B) -> tuple[np.ndarray, np.ndarray]:
  return host_object(call_id, "stop")._keep(tokens_BxW, before_B, after_B)
