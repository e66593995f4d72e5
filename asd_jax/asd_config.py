"""Settings of the ASD verification rule (specs/asd.md) and the paper's named presets."""

from __future__ import annotations

import dataclasses
import math
import numbers

# The largest values the jitted rule's float32 budget/gate and int32 counter hold.
FLOAT32_MAX = 3.4028234663852886e38
INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class ASDConfig:
  """Frozen, hashable settings of one ASD verifier.

  Attributes:
    budget: regret budget B of one request, in target-logit units (>= 0, finite).
    gate: local gate g on r_i / q_i (>= 0, finite).
    max_exceptions: cap M on accepted mismatches per block (int >= 0).
    normalize_q: use q_i = (K - i) / K instead of q_i = K - i.

  `budget == 0` or `max_exceptions == 0` make the rule exactly strict greedy verification,
  exact logit ties included. `gate == 0` is strict except that it still accepts a mismatch of
  zero regret (an exact tie with a different id), as the rule's `r / q <= g` test is written. Only `normalize_q` changes the compiled program; the other
  fields enter the jitted rule as traced scalars, so sweeping them never recompiles.
  """

  budget: float
  gate: float
  max_exceptions: int
  normalize_q: bool = False

  def __post_init__(self):
    for name in ("budget", "gate"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"ASDConfig.{name} must be a real number, got {value!r}")
      # The rule runs in float32: a larger value would turn into inf there, past this check.
      if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise ValueError(f"ASDConfig.{name} must be finite in float32, got {value!r}")
      if value < 0:
        raise ValueError(f"ASDConfig.{name} must be >= 0, got {value!r}")
      object.__setattr__(self, name, float(value))
    m = self.max_exceptions
    if isinstance(m, bool) or not isinstance(m, numbers.Integral):
      raise TypeError(f"ASDConfig.max_exceptions must be an int, got {m!r}")
    if not 0 <= m <= INT32_MAX:  # the exception counter is an int32
      raise ValueError(f"ASDConfig.max_exceptions must be in [0, {INT32_MAX}], got {m!r}")
    object.__setattr__(self, "max_exceptions", int(m))
    if not isinstance(self.normalize_q, bool):
      raise TypeError(f"ASDConfig.normalize_q must be a bool, got {self.normalize_q!r}")

  @property
  def is_strict(self) -> bool:
    """True when the settings can never accept a mismatch (budget 0 or cap 0)."""
    return self.budget == 0.0 or self.max_exceptions == 0


# Paper primary setting (Qwen3-14B + block-7 drafter), tuned on a disjoint GSM8K slice.
PAPER = ASDConfig(budget=8.0, gate=0.25, max_exceptions=2)
# The paper's exploratory best; for discovery, not for reporting.
EXPLORATORY = ASDConfig(budget=12.0, gate=0.5, max_exceptions=2)
# Budget 0: exactly strict greedy verification.
STRICT = ASDConfig(budget=0.0, gate=0.0, max_exceptions=0)

PRESETS = {"paper": PAPER, "exploratory": EXPLORATORY, "strict": STRICT}


def preset_with(name: str, **fields) -> ASDConfig:
  """The preset called `name` with the given fields replaced; a field given as None keeps the
  preset's value. The result is checked like any ASDConfig."""
  if name not in PRESETS:
    raise ValueError(f"unknown ASD preset {name!r}; choose one of {', '.join(PRESETS)}")
  return dataclasses.replace(PRESETS[name],
                             **{k: v for k, v in fields.items() if v is not None})
