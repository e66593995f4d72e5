"""Training sharding: the inference table of models/sharding.py, on a (data, model) mesh.

Logical axes come from models.sharding.LOGICAL_AXES (keyed by the last two parameter-path
parts); this module adds the parameters only drafters have and maps everything through the
one RULES table. Mesh: 2-D ("data", "model"); batches split over "data", the frozen target
and the drafter's wide matrices over "model", optimiser moments like their parameters.
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.sharding import LOGICAL_AXES, RULES, logical_to_spec

MESH_AXES = ("data", "model")

# Drafter parameters; models/sharding.LOGICAL_AXES wins where it names the same parameter
# (it now lists fc / res / own_head itself), so inference and training share one table.
TRAIN_LOGICAL_AXES: dict[tuple[str, str], tuple[str | None, ...]] = {
    ("fc", "kernel"): (None, "embed"),  # EAGLE-3 fused-feature projection [3D, D]
    ("res", "kernel"): (None, "embed", None),  # Medusa ResBlocks [M, D, D]
    ("own_head", "kernel"): (None, "embed", "vocab"),  # Medusa own heads [M, D, V]
    **LOGICAL_AXES,
}


def parse_mesh(text: str) -> tuple[int, int]:
  """'DxM' -> (D, M)."""
  try:
    d, m = (int(x) for x in text.lower().split("x"))
  except ValueError:
    raise ValueError(f"--mesh must look like DxM (e.g. 4x2), got {text!r}") from None
  if d <= 0 or m <= 0:
    raise ValueError(f"--mesh sizes must be positive, got {text!r}")
  return d, m


def make_mesh(data: int, model: int, num_devices: int | None = None) -> Mesh:
  """A (data, model) mesh over the first D*M devices; D*M must equal the devices in use."""
  devices = jax.devices()
  use = len(devices) if num_devices is None else num_devices
  if use > len(devices):
    raise ValueError(f"--num-devices={use} but only {len(devices)} devices are visible")
  if data * model != use:
    hint = "" if num_devices is not None else (
        f" (pass --num-devices={data * model} to run on a subset)"
        if data * model < use else "")
    raise ValueError(f"--mesh={data}x{model} needs {data * model} devices but {use} are in "
                     f"use{hint}")
  return Mesh(np.array(devices[:use]).reshape(data, model), MESH_AXES)


def _names(path) -> list[str]:
  names = [getattr(p, "key", getattr(p, "name", getattr(p, "idx", None))) for p in path]
  return [str(n) for n in names if n is not None and str(n) != "value"]


def tree_specs(tree, mesh: Mesh, rules: Mapping[str, str | None] = RULES):
  """PartitionSpecs for any pytree whose paths end in known (module, parameter) names:
  parameters, optimiser states (optax nests the parameter paths) and checkpoints alike."""

  def spec(path, leaf):
    names = _names(path)
    axes = TRAIN_LOGICAL_AXES.get(tuple(names[-2:])) if len(names) >= 2 else None
    if axes is None or len(axes) != getattr(leaf, "ndim", 0):
      return PartitionSpec()
    s = logical_to_spec(axes, rules, mesh)
    if any(m is not None and dim % mesh.shape[m] for dim, m in zip(leaf.shape, s)):
      return PartitionSpec()  # not evenly divisible: replicate
    return s

  return jax.tree_util.tree_map_with_path(spec, tree)


def tree_shardings(tree, mesh: Mesh):
  return jax.tree.map(lambda s: NamedSharding(mesh, s), tree_specs(tree, mesh),
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows over "data", everything else replicated."""
  return NamedSharding(mesh, PartitionSpec("data"))
