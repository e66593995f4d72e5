"""Sharding in one place: logical axis names for every parameter, one rules table to a mesh.

Parameters are named by their path in the NNX state (e.g. `layers/3/attn/q_proj/kernel`); the
last two path parts pick the logical axes below. `RULES` maps logical axes onto mesh axes;
the same table serves inference (tensor parallel over "model") and training (batch over
"data"). Anything not listed is replicated.
"""

from __future__ import annotations

from typing import Mapping

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# (module, parameter) -> logical axes of the array
LOGICAL_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("q_proj", "kernel"): ("embed", "heads"),
    ("k_proj", "kernel"): ("embed", "kv_heads"),
    ("v_proj", "kernel"): ("embed", "kv_heads"),
    ("q_proj", "bias"): ("heads",),
    ("k_proj", "bias"): ("kv_heads",),
    ("v_proj", "bias"): ("kv_heads",),
    ("o_proj", "kernel"): ("heads", "embed"),
    ("gate_proj", "kernel"): ("embed", "mlp"),
    ("up_proj", "kernel"): ("embed", "mlp"),
    ("down_proj", "kernel"): ("mlp", "embed"),
    # Drafters: EAGLE-3's layer reuses the names above; Medusa's own heads split the vocab.
    ("own_head", "kernel"): (None, "embed", "vocab"),
    ("fc", "kernel"): (None, "embed"),
    ("res", "kernel"): (None, "embed", None),
}

# Megatron-style tensor parallelism: heads and MLP columns split over "model", the vocabulary
# too (the head is 13% of a SmolLM2 step); activations and norms replicated.
RULES: dict[str, str | None] = {
    "batch": "data",
    "vocab": "model",
    "heads": "model",
    "kv_heads": "model",
    "mlp": "model",
    "embed": None,
}


def logical_to_spec(axes: tuple[str | None, ...], rules: Mapping[str, str | None],
                    mesh: Mesh) -> PartitionSpec:
  """Maps logical axes to mesh axes, dropping mesh axes the mesh lacks or has at size 1."""
  out = []
  for a in axes:
    m = rules.get(a) if a is not None else None
    out.append(m if m in mesh.shape and mesh.shape[m] > 1 else None)
  return PartitionSpec(*out)


def param_specs(params, mesh: Mesh, rules: Mapping[str, str | None] = RULES):
  """A pytree of PartitionSpecs matching `params` (an NNX state, or any pytree whose paths end
  in its parameters' names, such as an optax state), from LOGICAL_AXES."""

  def spec(path, leaf):
    names = [getattr(p, "key", getattr(p, "name", getattr(p, "idx", None))) for p in path]
    names = [str(n) for n in names if n is not None and str(n) != "value"]
    axes = LOGICAL_AXES.get(tuple(names[-2:])) if len(names) >= 2 else None
    if axes is None or len(axes) != getattr(leaf, "ndim", 0):
      return PartitionSpec()
    spec = logical_to_spec(axes, rules, mesh)
    for dim, m in zip(leaf.shape, spec):
      if m is not None and dim % mesh.shape[m]:
        return PartitionSpec()  # not evenly divisible: keep this one replicated
    return spec

  return jax.tree_util.tree_map_with_path(spec, params)


def shard_params(params, mesh: Mesh, rules: Mapping[str, str | None] = RULES):
  """Places `params` on `mesh` according to the rules table."""
  specs = param_specs(params, mesh, rules)
  return jax.tree_util.tree_map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)),
                                params, specs)
