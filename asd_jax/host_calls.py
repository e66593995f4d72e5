"""The host objects of one decode call (its TokenStream, its StopStrings), found by a traced id.

A decode loop's host callbacks need the call's own stream and stop strings. Passing those
objects as static jit arguments would bake them into the compiled program: a new TokenStream or
a new set of stop strings per request would compile the whole loop again and keep the old
program cached. Instead the program holds a `HostCall`: which callbacks to trace (static, part
of the pytree structure) and a call id (a traced int32). `host_calls` registers the call's
objects under a fresh id for as long as the call runs, and the callbacks look them up with
`host_object`. So one compiled program serves every stream and every stop string set, and calls
from several threads each find their own objects.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Any, Iterator

import flax.struct
import numpy as np


@flax.struct.dataclass
class HostCall:
  """What the decode loop's host callbacks need: which ones to trace and the call's id."""
  call_id: Any                                          # int32 scalar, traced
  stream: bool = flax.struct.field(pytree_node=False, default=False)
  stop: bool = flax.struct.field(pytree_node=False, default=False)


NO_HOST_CALL = HostCall(np.int32(0))  # neither callback traced: the plain program

_ACTIVE: dict[int, dict[str, Any]] = {}
_IDS = itertools.count()
_LOCK = threading.Lock()


@contextlib.contextmanager
def host_calls(*, stream=None, stop=None) -> Iterator[HostCall]:
  """Registers this call's stream and stop strings (either may be None) while the block runs.

  The block must wait for the loop to finish before it ends (finish_stream and finish_stop
  do): a callback of a loop still running after the block would find nothing."""
  if stream is None and stop is None:
    yield NO_HOST_CALL
    return
  with _LOCK:
    call_id = 1 + next(_IDS) % (2**31 - 1)  # a positive int32 (calls 2**31 apart never overlap)
    _ACTIVE[call_id] = {"stream": stream, "stop": stop}
  try:
    yield HostCall(np.int32(call_id), stream=stream is not None, stop=stop is not None)
  finally:
    with _LOCK:
      del _ACTIVE[call_id]


def host_object(call_id, name: str):
  """Inside a host callback: the `name` object ('stream' or 'stop') of the running call."""
  with _LOCK:
    return _ACTIVE[int(call_id)][name]


def active_calls() -> int:
  """How many calls are registered now (0 between decode calls; tests check nothing leaks)."""
  with _LOCK:
    return len(_ACTIVE)
