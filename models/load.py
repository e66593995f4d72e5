"""One call from a model name or path to a ready-to-run decoder (and, on request, tokenizer)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from models.config import ModelConfig
from models.hf_params import decoder_from_hf_tensors
from models.llama import Decoder
from models.registry import load_checkpoint, resolve_checkpoint

DEFAULT_TARGET = "smollm2-135m"


@dataclasses.dataclass
class LoadedModel:
  cfg: ModelConfig
  model: Decoder
  hf_config: dict[str, Any]
  source: str


def load_decoder(name_or_path: str | os.PathLike = DEFAULT_TARGET,
                 dtype: str = "float32") -> LoadedModel:
  """Loads weights from a known name, an HF folder or a GGUF file into a `Decoder`.

  Raises UnknownModelError / CheckpointError / UnsupportedArchitectureError (all ValueError)
  with a one-line message naming the problem.
  """
  resolved = resolve_checkpoint(name_or_path)
  hf_config, tensors = load_checkpoint(name_or_path)
  cfg = ModelConfig.from_hf_config(hf_config, dtype=dtype)
  model = decoder_from_hf_tensors(cfg, tensors, source=str(resolved.path))
  return LoadedModel(cfg=cfg, model=model, hf_config=hf_config, source=str(resolved.path))
