"""Objective registry: `--objective=baseline` picks the drafter's baseline loss;
`--objective=vsd` the VSD objective (specs/vsd.md) over the same EAGLE-3 drafter and data."""

from __future__ import annotations

import numpy as np

from models.llama import Decoder
from vsd_jax.objective_api import Objective

OBJECTIVES = ("baseline", "vsd")


def make_objective(cfg, target: Decoder, token_counts_Vt: np.ndarray,
                   objective: str = "baseline") -> Objective:
  if objective not in OBJECTIVES:
    raise ValueError(f"unknown objective {objective!r}; choose one of {OBJECTIVES}")
  if objective == "vsd":
    from vsd_jax.vsd_objective import make_vsd_objective
    return make_vsd_objective(cfg, target, token_counts_Vt)
  if cfg.drafter == "eagle3":
    from vsd_jax.eagle3_ttt import make_eagle3_objective
    return make_eagle3_objective(cfg, target, token_counts_Vt)
  if cfg.drafter == "medusa":
    from vsd_jax.medusa_loss import make_medusa_objective
    return make_medusa_objective(cfg, target, token_counts_Vt)
  from vsd_jax.distill_loss import make_distill_objective
  return make_distill_objective(cfg, target, token_counts_Vt)
