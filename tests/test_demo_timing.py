"""The demo (and the timing scripts) time each configuration only after its warm-up call has
finished, in turns."""

import time

from asd_jax.cli_common import time_interleaved


class _Pending:
  """Stands in for a dispatched device result: ready only once block_until_ready returns."""

  def __init__(self, events, name):
    self.events, self.name = events, name

  def block_until_ready(self):
    time.sleep(0.05)  # the device work the host would otherwise not wait for
    self.events.append(f"{self.name} ready")
    return self


def test_warm_ups_are_waited_for_and_passes_take_turns():
  events, calls = [], {"a": 0, "b": 0}

  def run(name):
    def fn():
      calls[name] += 1
      events.append(f"{name}{calls[name]}")
      return _Pending(events, f"{name}{calls[name]}")
    return fn

  outputs, seconds = time_interleaved({"a": run("a"), "b": run("b")}, passes=2)
  assert events == ["a1", "a1 ready", "b1", "b1 ready",   # warm-ups, each waited for
                    "a2", "a2 ready", "b2", "b2 ready",   # timed pass 1
                    "a3", "a3 ready", "b3", "b3 ready"]   # timed pass 2
  for name in "ab":
    assert outputs[name].name == f"{name}1"               # the warm-up's output is returned
    assert 0.05 <= seconds[name] < 1.0  # a timed call's own wait, not the warm-up's
