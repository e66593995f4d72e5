"""The host objects of one decode call (its TokenStream, its StopStrings), found by a traced id.

A decode loop's host callbacks need the call's own stream and stop strings. Passing those
objects as static jit arguments would bake them into the compiled program: a new TokenStream or
a new set of stop strings per request would compile the whole loop again and keep the old
program cached. Instead the program holds a `HostCall`: which callbacks to trace (static, part
of the pytree structure) and a call id (a traced int32). `host_calls` registers the call's
objects under a fresh id for as long as the call runs, and the callbacks look them up with
`host_object`. So one compiled program serves every stream and every stop string set, and calls
from several threads each find their own objects.

A Python exception cannot cross the compiled loop (XLA turns it into an INTERNAL runtime
error). So each object keeps the first exception its callback raised in its `_error` list and
skips its work for the rest of the call; `host_calls` clears those lists when a call starts and
`finish_host_calls` raises the first kept exception, unchanged, once the loop has finished.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Iterator

import flax.struct
import jax
import numpy as np


@flax.struct.dataclass
class HostCall:
  """What the decode loop's host callbacks need: which ones to trace and the call's id."""
  call_id: Any                                          # int32 scalar, traced
  stream: bool = flax.struct.field(pytree_node=False, default=False)
  stop: bool = flax.struct.field(pytree_node=False, default=False)
  # With stop strings: which token ids may complete one, per row (asd_jax/stop_gate.py), or
  # None to check every round.
  stop_gate_BxM: Any = None


NO_HOST_CALL = HostCall(np.int32(0))  # neither callback traced: the plain program

_ACTIVE: dict[int, dict[str, Any]] = {}
_IDS = itertools.count()
_LOCK = threading.Lock()


@contextlib.contextmanager
def host_calls(*, stream=None, stop=None) -> Iterator[HostCall]:
  """Registers this call's stream and stop strings (either may be None) while the block runs.

  The block must end with finish_host_calls: a callback of a loop still running after the block
  would find nothing."""
  if stream is None and stop is None:
    yield NO_HOST_CALL
    return
  for obj in (stream, stop):
    if obj is not None:
      obj._error.clear()  # a previous call's exception
  with _LOCK:
    call_id = 1 + next(_IDS) % (2**31 - 1)  # a positive int32 (calls 2**31 apart never overlap)
    _ACTIVE[call_id] = {"stream": stream, "stop": stop}
  try:
    yield HostCall(np.int32(call_id), stream=stream is not None, stop=stop is not None,
                   stop_gate_BxM=None if stop is None else stop.gate())
  finally:
    with _LOCK:
      del _ACTIVE[call_id]


def finish_host_calls(host: HostCall, result):
  """Returns `result`; with host callbacks, first waits for the loop to finish and raises the
  first exception a callback kept (the stream's before the stop strings')."""
  if not (host.stream or host.stop):
    return result
  jax.block_until_ready(result)
  for obj in _ACTIVE[int(host.call_id)].values():
    if obj is not None and obj._error:
      raise obj._error[0]
  return result


def host_object(call_id, name: str):
  """Inside a host callback: the `name` object ('stream' or 'stop') of the running call."""
  with _LOCK:
    return _ACTIVE[int(call_id)][name]


def active_calls() -> int:
  """How many calls are registered now (0 between decode calls; tests check nothing leaks)."""
  with _LOCK:
    return len(_ACTIVE)
