"""Training sharding: the inference table of models/sharding.py, on a (data, model) mesh.

Logical axes and the RULES table are models/sharding.py's, drafters' parameters included, so
inference and training share one table; this module only adds the mesh. Mesh: 2-D ("data",
"model"); batches split over "data", the frozen target and the drafter's wide matrices over
"model", optimiser moments like their parameters.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.sharding import param_specs

MESH_AXES = ("data", "model")


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


def tree_shardings(tree, mesh: Mesh):
  """NamedShardings for params, optimiser states (optax nests the parameter paths) and
  checkpoints alike: models/sharding.param_specs keys on each path's last two names."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s), param_specs(tree, mesh),
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Rows over "data", everything else replicated."""
  return NamedSharding(mesh, PartitionSpec("data"))
