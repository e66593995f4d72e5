"""Named model pairs for `--pair NAME` in `python -m asd_jax.generate` and `asd_jax.bench`: a
target and the drafter shipped for it, so one name sets both.

A pair's drafter is its best-agreeing trained drafter (highest tau). Where speed was measured it
was not the fastest choice: on two CPU cores a verified token costs arithmetic (README, "Why
speculation does not pay more on this CPU"), and on one H200 the model-free n-gram store ran
at 1.65x plain strict against 1.28x for the EAGLE-3 tree (the standalone drafter was not run
there; README, "On the H200 again"). `--target T --draft ngram+store` gives the store.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelPair:
  target: str  # a known model name (models/registry.py)
  draft: str  # a shipped drafter name (models/drafter_folder.KNOWN_DRAFTERS)


PAIRS: dict[str, ModelPair] = {
    # the suite runs' best trained drafter: tau 1.31 chain K=2, 1.60 tree 4,4,16 (EAGLE-3: 1.28,
    # 1.56; README, "Benchmarks")
    "smollm2-135m": ModelPair(target="smollm2-135m", draft="smollm2-135m-standalone"),
}


def get_pair(name: str) -> ModelPair:
  if name not in PAIRS:
    raise ValueError(f"unknown model pair {name!r}; known pairs: {', '.join(sorted(PAIRS))}")
  return PAIRS[name]


def apply_pair(args, parser) -> None:
  """Sets args.target and args.draft from args.pair (when given). A --target or --draft that
  names something else conflicts and is refused, rather than one of them silently winning."""
  if args.pair is None:
    return
  pair = get_pair(args.pair)
  for flag, field, value in (("--target", "target", pair.target), ("--draft", "draft", pair.draft)):
    given = getattr(args, field)
    if given not in (parser.get_default(field), value):
      raise ValueError(f"--pair {args.pair} sets {flag} {value}, but {flag} {given} was also "
                       f"given; pass --target/--draft without --pair to choose both")
    setattr(args, field, value)
