"""Offline target features: the frozen target's hidden layers for every training example,
computed once and memory-mapped, instead of a target forward inside every train step.

File: <data_dir>/features_<key>.npy, float32 [N, T, L, D] (N train examples in stored order,
T = seq_len, L = the objective's `target_hidden_layers`); `key` hashes the target, the layers,
T and the dataset's identity (its metadata and size), so a cache is never read for another
setting or for an older build of the dataset. Written to a temporary file and renamed
when complete. Pays off from the second epoch on; the first costs one target forward per
example either way. (SmolLM2-135M, EAGLE-3 layers, T=192: 1.8 MB per example.)
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import flax.nnx as nnx
import jax
import numpy as np
from tqdm import tqdm

from vsd_jax.data import fixed_batches
from vsd_jax.dataset_builder import DatasetError, dataset_metadata, open_split
from vsd_jax.objective_api import target_hidden


def cache_path(data_dir, target_source: str, layers: tuple[int, ...], seq_len: int,
               train_rows: int) -> Path:
  # The dataset's identity tells one build from another: its metadata (counts, token totals,
  # the generation run) and the number of train rows the cache is indexed by.
  what = [target_source, list(layers), seq_len, [dataset_metadata(data_dir), train_rows]]
  key = hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()
  return Path(data_dir) / f"features_{key[:16]}.npy"


def load_or_build(data_dir, target, layers: tuple[int, ...], seq_len: int, batch_size: int,
                  log=print) -> np.ndarray:
  """The memory-mapped cache [N, T, L, D], building it first if needed."""
  if not layers:
    raise ValueError("this objective reads the target's logits, not hidden layers; offline "
                     "features need an EAGLE-3 or Medusa drafter (use features=online)")
  train_rows = len(open_split(data_dir, "train"))
  path = cache_path(data_dir, target.source, layers, seq_len, train_rows)
  if not path.is_file():
    graphdef, params = nnx.split(target.model)
    fn = jax.jit(lambda p, b: target_hidden(graphdef, p, b, layers))
    batches = fixed_batches(data_dir, "train", batch_size, seq_len)
    n = sum(int((b["length"] > 0).sum()) for b in batches)
    shape = (n, seq_len, len(layers), target.cfg.hidden_size)
    tmp = path.with_suffix(f".tmp-{os.getpid()}.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float32, shape=shape)
    log(f"building the offline feature cache {path} ({np.prod(shape) * 4 / 2**30:.2f} GiB)")
    at = 0
    for b in tqdm(batches, desc="target features", mininterval=5):
      real = int((b["length"] > 0).sum())  # the last batch is padded
      out[at:at + real] = np.asarray(fn(params, {"tokens": b["tokens"]}))[:real]
      at += real
    out.flush()
    del out
    os.replace(tmp, path)
  features = np.load(path, mmap_mode="r")
  if features.shape[:2] != (train_rows, seq_len):  # rows past the end would fail mid-run
    raise DatasetError(f"offline feature cache {path} holds {features.shape[0]} rows of "
                       f"{features.shape[1]} tokens, the dataset {train_rows} of {seq_len}; "
                       "delete it so it is rebuilt")
  return features
