"""One call from a model name or path to a ready-to-run decoder (and, on request, tokenizer)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from models.config import ModelConfig
from models.hf_params import attach_weight_blocks, decoder_from_hf_tensors
from models.llama import Decoder
from models.native_kernels import native_available
from models.registry import load_checkpoint, load_weight_blocks, resolve_checkpoint

DEFAULT_TARGET = "smollm2-135m"


@dataclasses.dataclass
class LoadedModel:
  cfg: ModelConfig
  model: Decoder
  hf_config: dict[str, Any]
  source: str


def load_decoder(name_or_path: str | os.PathLike = DEFAULT_TARGET,
                 dtype: str = "float32", weight_blocks: bool = True) -> LoadedModel:
  """Loads weights from a known name, an HF folder or a GGUF file into a `Decoder`.

  With `weight_blocks` (and float32, a GGUF checkpoint and the native kernels available) the
  decoder also keeps the file's Q4_1/Q8_0 blocks, which its few-row matmuls read instead of
  the float32 weights: the same numbers and the same results, a fifth of the bytes per step
  (models/block_quant.py).

  Raises UnknownModelError / CheckpointError / UnsupportedArchitectureError (all ValueError)
  with a one-line message naming the problem.
  """
  resolved = resolve_checkpoint(name_or_path)
  hf_config, tensors = load_checkpoint(name_or_path)
  cfg = ModelConfig.from_hf_config(hf_config, dtype=dtype)
  model = decoder_from_hf_tensors(cfg, tensors, source=str(resolved.path))
  if weight_blocks and resolved.kind == "gguf" and dtype == "float32" and native_available():
    attach_weight_blocks(model, load_weight_blocks(name_or_path))
  return LoadedModel(cfg=cfg, model=model, hf_config=hf_config, source=str(resolved.path))
