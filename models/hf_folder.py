"""Read and write Hugging Face checkpoint folders: config.json + safetensors (single or sharded).

Tensors keep their HF names and orientation (Linear weights [out, in]); converting them into
the Flax model's layout is the model code's job, not this module's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes  # noqa: F401  # registers "bfloat16" with numpy; safetensors' numpy reader needs it
import numpy as np
import safetensors
import safetensors.numpy

from models.errors import CheckpointError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def load_hf_folder(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Loads config.json and all safetensors weights of an HF folder.

  `model.safetensors` wins over a sharded `model.safetensors.index.json` when both exist, as in
  transformers.

  Returns:
    (hf_config, tensors): config.json as a dict; every tensor under its HF name, e.g.
    `model.layers.0.self_attn.q_proj.weight` f32[H*Dh, D]. Floating tensors (bf16, f16, f32,
    f64) come back as float32; integer tensors keep their dtype.

  Raises:
    CheckpointError naming the folder, file or tensor at fault.
  """
  folder = Path(path)
  if not folder.is_dir():
    raise CheckpointError(f"checkpoint folder {folder} does not exist")
  config = _read_json(folder / CONFIG_FILE)
  if not isinstance(config, dict):
    raise CheckpointError(f"{folder / CONFIG_FILE} is not a JSON object")

  single, index = folder / WEIGHTS_FILE, folder / INDEX_FILE
  if single.is_file():
    return config, _read_safetensors(single)
  if not index.is_file():
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = f" (found {', '.join(others)}: only safetensors is supported)" if others else ""
    raise CheckpointError(f"no weights in {folder}: expected {WEIGHTS_FILE} or {INDEX_FILE}{hint}")

  weight_map = _read_json(index).get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise CheckpointError(f"{index} has no 'weight_map'")
  by_shard: dict[str, list[str]] = {}
  for name, shard in weight_map.items():
    by_shard.setdefault(shard, []).append(name)
  tensors = {}
  for shard, names in sorted(by_shard.items()):
    shard_path = folder / shard
    if not shard_path.is_file():
      raise CheckpointError(f"{index} names shard {shard} (for {names[0]}), which is missing")
    loaded = _read_safetensors(shard_path)
    missing = [n for n in names if n not in loaded]
    if missing:
      raise CheckpointError(
          f"shard {shard_path} lacks {len(missing)} tensor(s) listed in {index.name}, "
          f"e.g. {missing[0]}")
    tensors.update(loaded)
  return config, tensors


def save_hf_folder(path: str | os.PathLike, hf_config: Mapping[str, Any],
                   tensors: Mapping[str, np.ndarray]) -> None:
  """Writes config.json and a single model.safetensors into `path` (created if needed).

  Not atomic on its own; callers that need that write into a temp folder and rename it.
  The `format: pt` metadata lets transformers' from_pretrained read the file too.
  """
  folder = Path(path)
  folder.mkdir(parents=True, exist_ok=True)
  with open(folder / CONFIG_FILE, "w") as f:
    json.dump(dict(hf_config), f, indent=2, sort_keys=True)
    f.write("\n")
  arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
  safetensors.numpy.save_file(arrays, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


def _read_json(path: Path) -> Any:
  if not path.is_file():
    raise CheckpointError(f"{path} is missing")
  try:
    with open(path) as f:
      return json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{path} is not valid JSON: {e}") from e


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
  try:
    with safetensors.safe_open(str(path), framework="numpy") as f:
      raw = {name: f.get_tensor(name) for name in f.keys()}
  except (safetensors.SafetensorError, OSError) as e:
    raise CheckpointError(f"{path} is corrupt or truncated: {e}") from e
  # bf16 / fp8 arrive as ml_dtypes types (numpy kind "V"), so test for "not integer".
  return {name: t if t.dtype.kind in "iub" else t.astype(np.float32, copy=False)
          for name, t in raw.items()}


MANIFEST_FILE = "manifest.json"
WRITTEN_FILES = (CONFIG_FILE, WEIGHTS_FILE, MANIFEST_FILE)  # all that replace_hf_folder writes


def check_replaceable(path: str | os.PathLike) -> None:
  """Raises CheckpointError unless replacing `path` whole loses nothing but an earlier drafter.

  Fine: a missing path, an empty folder, or a folder holding only the files `replace_hf_folder`
  writes whose config.json shows a drafter wrote it: an `asd_jax_*` key (this repo's drafter
  writers), an EAGLE-3 architecture (`export_eagle3`), or a manifest.json beside it. A plain HF
  model folder, a file, or a folder holding anything else is someone's data, not ours to delete.
  """
  target = Path(path)
  if not target.exists() and not target.is_symlink():
    return
  if not target.is_dir():
    raise CheckpointError(f"{target} exists and is not a folder; refusing to replace it with a "
                          "drafter folder (pick a new path)")
  names = sorted(p.name for p in target.iterdir())
  if not names:
    return
  others = [n for n in names if n not in WRITTEN_FILES or not (target / n).is_file()]
  if others:
    raise CheckpointError(f"{target} holds {', '.join(others[:3])}"
                          f"{' ...' if len(others) > 3 else ''}, so it is not an exported drafter "
                          "folder; refusing to replace it (pick a new or empty path)")
  try:
    config = _read_json(target / CONFIG_FILE)
  except CheckpointError as e:
    raise CheckpointError(f"{target} is not an exported drafter folder ({e}); refusing to "
                          "replace it (pick a new or empty path)") from None
  ours = isinstance(config, dict) and (
      MANIFEST_FILE in names or any(str(k).startswith("asd_jax_") for k in config)
      or any("Eagle3" in str(a) for a in config.get("architectures") or []))
  if not ours:
    raise CheckpointError(f"{target}/{CONFIG_FILE} is not a drafter's (no manifest.json, no "
                          "asd_jax_* key, no EAGLE-3 architecture); refusing to replace what may "
                          "be a model folder (pick a new or empty path)")


def replace_hf_folder(path: str | os.PathLike, hf_config: Mapping[str, Any],
                      tensors: Mapping[str, np.ndarray],
                      manifest: Mapping[str, Any] | None = None) -> Path:
  """Writes an HF folder (and manifest.json, if given) and swaps it in for `path` whole.

  The folder is written next to `path` and renamed into place, so readers never see half of
  it; a previous drafter folder at `path` is replaced (anything else there is refused, see
  `check_replaceable`). Files get ordinary permissions (mkdtemp and safetensors create
  owner-only ones).
  """
  target = Path(path)
  check_replaceable(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
  old = target.parent / f".{target.name}.old-{os.getpid()}"
  try:
    save_hf_folder(tmp, hf_config, tensors)
    if manifest is not None:
      with open(tmp / MANIFEST_FILE, "w") as f:
        json.dump(dict(manifest), f, indent=2, sort_keys=True, default=_json_default)
        f.write("\n")
    for file in tmp.iterdir():
      file.chmod(0o644)
    tmp.chmod(0o755)
    if target.exists():
      os.replace(target, old)
    os.replace(tmp, target)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
  return target


def _json_default(x):
  if isinstance(x, np.generic) or hasattr(x, "__array__"):  # numpy and jax scalars/arrays
    return np.asarray(x).tolist()
  raise TypeError(f"manifest value of type {type(x).__name__} is not JSON-serialisable")
