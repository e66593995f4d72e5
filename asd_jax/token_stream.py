"""Streaming: newly committed tokens reach the host while the jitted decode loop is running.

The engines run a whole request as one `lax.while_loop`, so streaming is an ordered host
callback at each commit (prefill's first token, then every step or round) carrying the output
buffer and each row's generated count before and after. Without a stream nothing is traced,
so the non-streaming program is unchanged. The callback finds the call's TokenStream by the
call's id (asd_jax/host_calls.py), so a new TokenStream does not compile the loop again. The
callback blocks the loop while it runs: keep `on_tokens` cheap (print, queue.put).

An exception raised by `on_tokens` cannot cross the compiled loop (XLA would turn it into an
INTERNAL runtime error): the stream keeps the first one, calls `on_tokens` no more for that
decode call, and the engine raises it, the caller's own exception, once the loop has finished
(asd_jax/host_calls.py).

Shape notation: B rows, W output buffer width.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import numpy as np

from asd_jax.host_calls import HostCall, host_object


@dataclasses.dataclass(frozen=True, eq=False)
class TokenStream:
  """on_tokens(row, tokens): called on the host, in order, with the tokens `row` just
  committed (a list of ints; EOS included when hit, exactly the tokens the result holds).

  Any TokenStream runs the same compiled program. One TokenStream may serve many decode calls,
  one at a time (it holds the running call's error).
  """

  on_tokens: Callable[[int, list[int]], None]
  # The first exception on_tokens raised in the current decode call (a one-item list, so
  # that the frozen dataclass can hold it).
  _error: list = dataclasses.field(default_factory=list, init=False, repr=False)

  def __post_init__(self):
    # Otherwise a non-callable fails inside the running loop as an XLA INTERNAL error.
    if not callable(self.on_tokens):
      raise TypeError(f"on_tokens must be callable (row, tokens), got "
                      f"{type(self.on_tokens).__name__}")

  def _deliver(self, tokens_BxW, before_B, after_B) -> None:
    if self._error:
      return
    tokens_BxW, before_B, after_B = (np.asarray(x) for x in (tokens_BxW, before_B, after_B))
    try:
      for row in np.flatnonzero(after_B > before_B):
        self.on_tokens(int(row), tokens_BxW[row, before_B[row]:after_B[row]].tolist())
    except Exception as e:  # noqa: BLE001 - re-raised by finish_host_calls, unchanged
      self._error.append(e)


def check_stream(stream: TokenStream | None) -> None:
  """At the Python boundary of a decode call: anything else would fail inside the running
  loop."""
  if stream is not None and not isinstance(stream, TokenStream):
    raise TypeError(f"stream must be a TokenStream, got {type(stream).__name__}")


def emit(host: HostCall, tokens_BxW: jax.Array, before_B: jax.Array,
         after_B: jax.Array) -> None:
  """Inside a jitted loop: sends rows' tokens [before_B, after_B) to the call's stream (none
  traced without one; the engine checked it with check_stream at the call's boundary)."""
  if not host.stream:
    return
  jax.debug.callback(_deliver, host.call_id, tokens_BxW, before_B, after_B, ordered=True)


def _deliver(call_id, tokens_BxW, before_B, after_B) -> None:
  host_object(call_id, "stream")._deliver(tokens_BxW, before_B, after_B)
