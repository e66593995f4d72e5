"""The demo times each configuration only after its warm-up call has finished."""

import time

from asd_jax.demo import _timed


class _Pending:
  """Stands in for a dispatched device result: ready only once block_until_ready returns."""

  def __init__(self, events, name):
    self.events, self.name = events, name

  def block_until_ready(self):
    time.sleep(0.05)  # the device work the host would otherwise not wait for
    self.events.append(f"{self.name} ready")
    return self


def test_the_warm_up_is_waited_for_before_the_timer_starts():
  events, calls = [], 0

  def fn():
    nonlocal calls
    calls += 1
    events.append(f"call {calls}")
    return _Pending(events, f"call {calls}")

  _, seconds = _timed(fn)
  assert events == ["call 1", "call 1 ready", "call 2", "call 2 ready"]
  assert 0.05 <= seconds < 1.0  # the timed call's own wait, not the warm-up's
