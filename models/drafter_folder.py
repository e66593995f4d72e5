"""Standalone drafter folders: an HF-style Llama checkpoint that may borrow the target's embedding.

A small standalone drafter trained with a frozen copy of the target's (tied) embedding does not
store it: its config.json says `"asd_jax_shared_embedding": "target"` and model.safetensors lacks
`model.embed_tokens.weight`; the loader takes the embedding from the target. For SmolLM2-135M
that keeps a one-layer drafter at ~8 MB instead of ~64 MB, and at run time the drafter and the
target hold one embedding buffer between them. A `manifest.json` records how the folder was made.

Folders shipped with the repo live in <repo>/drafters/<name>/ and are found by `resolve_drafter`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from models.config import ModelConfig, rope_scaling_to_hf
from models.errors import CheckpointError, UnknownModelError
from models.hf_folder import MANIFEST_FILE, load_hf_folder, replace_hf_folder
from models.hf_params import decoder_from_hf_tensors, decoder_to_hf_tensors
from models.llama import Decoder, WeightBlocks

SHARED_EMBEDDING_KEY = "asd_jax_shared_embedding"
EMBEDDING_TENSOR = "model.embed_tokens.weight"
DRAFTERS_DIR = Path(__file__).resolve().parent.parent / "drafters"

# Drafters shipped in DRAFTERS_DIR: name -> the target they were distilled from (a registry name).
KNOWN_DRAFTERS: dict[str, str] = {
    "smollm2-135m-standalone": "smollm2-135m",
    "smollm2-135m-eagle3": "smollm2-135m",
    "smollm2-135m-medusa": "smollm2-135m",
}


def resolve_drafter(name_or_path: str | os.PathLike) -> Path:
  """A known drafter name (see KNOWN_DRAFTERS) or an existing folder -> the folder path.

  Raises:
    UnknownModelError: neither a known name nor an existing folder (lists the known names).
    CheckpointError: a known name whose folder is missing from the repo.
  """
  key = os.fspath(name_or_path)
  if key.lower() in KNOWN_DRAFTERS:
    folder = DRAFTERS_DIR / key.lower()
    if not (folder / "config.json").is_file():
      raise CheckpointError(f"drafter {key!r} should be in {folder}, which has no config.json; "
                            "rebuild it with scripts/distill_standalone_drafter.py")
    return folder
  path = Path(key).expanduser()
  if path.is_dir():
    return path.resolve()
  raise UnknownModelError(f"unknown drafter {key!r}: not a known name "
                          f"({', '.join(sorted(KNOWN_DRAFTERS))}) and no such folder")


def _target_embedding(target) -> Any:
  """The target's input embedding [V, D] from a LoadedModel, Decoder, HF tensor dict or array."""
  model = getattr(target, "model", target)  # LoadedModel -> Decoder
  if isinstance(model, Decoder):
    return model.embed.embedding[...]
  if isinstance(target, Mapping):
    if EMBEDDING_TENSOR not in target:
      raise CheckpointError(f"target tensors have no {EMBEDDING_TENSOR!r} to share")
    return target[EMBEDDING_TENSOR]
  if hasattr(target, "shape") and len(target.shape) == 2:
    return target
  raise TypeError("target must be a LoadedModel, a Decoder, a dict of HF tensors or an "
                  f"embedding array [V, D]; got {type(target).__name__}")


def load_standalone_drafter(path: str | os.PathLike, target=None,
                            dtype: str = "float32") -> Decoder:
  """Loads a drafter folder (or known name) into a `Decoder` of `dtype`.

  Args:
    path: a folder written by `save_standalone_drafter`, or a name from KNOWN_DRAFTERS.
    target: where a shared embedding comes from (LoadedModel, Decoder, HF tensor dict or an
      array [V, D]); required only when the folder's config says it shares the target's.
      When the target's embedding already has `dtype`, the drafter holds the same buffer.

  Raises:
    CheckpointError: missing target, or a target embedding whose shape is not the drafter's.
  """
  folder = resolve_drafter(path)
  hf_config, tensors = load_hf_folder(folder)
  from models.drafter_setup import kind_of_config  # drafter_setup imports this module
  kind = kind_of_config(hf_config)
  if kind != "standalone":  # else: a missing tensor or an unknown architecture, not the cause
    raise CheckpointError(f"{folder} holds a {kind} drafter, not a standalone LM; load it with "
                          f"models.drafter_setup.setup_drafter(..., kind={kind!r})")
  cfg = ModelConfig.from_hf_config(hf_config, dtype=dtype)
  shared = hf_config.get(SHARED_EMBEDDING_KEY)
  embedding = None
  if shared is not None:
    if shared != "target":
      raise CheckpointError(f"{folder}/config.json: {SHARED_EMBEDDING_KEY}={shared!r} is not "
                            "supported (only \"target\")")
    if target is None:
      raise CheckpointError(f"drafter {folder} shares the target's embedding; pass target=")
    embedding = _target_embedding(target)
    expected = (cfg.vocab_size, cfg.hidden_size)
    if tuple(embedding.shape) != expected:
      raise CheckpointError(
          f"drafter {folder} expects a target embedding of shape {expected} (vocab, width), "
          f"but the target's is {tuple(embedding.shape)}: a drafter for another target?")
    # decoder_from_hf_tensors only needs the value's shape here; the real buffer is set below.
    tensors = {**tensors, EMBEDDING_TENSOR: np.broadcast_to(np.float32(0), expected)}
  model = decoder_from_hf_tensors(cfg, tensors, source=str(folder))
  if embedding is not None:
    model.embed.embedding.set_value(jnp.asarray(embedding, jnp.dtype(dtype)))
    _share_head_blocks(model, target)
  return model


def _share_head_blocks(drafter: Decoder, target) -> None:
  """Gives a drafter that shares the target's tied embedding the target's Q8_0 head blocks too.

  The blocks hold exactly the numbers of the float32 embedding (models/block_quant.py), so the
  drafter's logits keep their bits while its head, the larger part of a small drafter's step,
  reads a quarter of the bytes. Nothing is shared when either side computes in another dtype,
  unties its head, or the target has no blocks.
  """
  source = getattr(target, "model", target)
  if not isinstance(source, Decoder) or source.head_q8_0_q is None:
    return
  if not (drafter.cfg.tie_embeddings and source.cfg.tie_embeddings):
    return
  if jnp.dtype(drafter.cfg.dtype) != jnp.float32:
    return
  drafter.head_q8_0_q = WeightBlocks(source.head_q8_0_q[...])
  drafter.head_q8_0_d = WeightBlocks(source.head_q8_0_d[...])


def hf_config_of(cfg: ModelConfig) -> dict[str, Any]:
  """An HF config.json dict that `ModelConfig.from_hf_config` parses back to `cfg`."""
  if cfg.qk_norm:
    arch, model_type = "Qwen3ForCausalLM", "qwen3"
  elif cfg.qkv_bias and not cfg.o_bias:
    arch, model_type = "Qwen2ForCausalLM", "qwen2"
  elif cfg.qkv_bias != cfg.o_bias:
    raise ValueError("o_bias without qkv_bias has no Hugging Face config equivalent")
  else:
    arch, model_type = "LlamaForCausalLM", "llama"
  hf = {
      "architectures": [arch], "model_type": model_type, "hidden_act": "silu",
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
      "tie_word_embeddings": cfg.tie_embeddings,
      "max_position_embeddings": cfg.max_position_embeddings, "torch_dtype": cfg.dtype,
  }
  if model_type == "llama":
    hf["attention_bias"] = cfg.qkv_bias
  if cfg.rope_scaling is not None:
    hf["rope_scaling"] = rope_scaling_to_hf(cfg.rope_scaling)
  return hf


def save_standalone_drafter(path: str | os.PathLike, model: Decoder, manifest: Mapping[str, Any],
                            share_embedding: bool = True, dtype: str = "bfloat16",
                            extra_config: Mapping[str, Any] | None = None) -> Path:
  """Writes `model` as a drafter folder: config.json, model.safetensors, manifest.json.

  share_embedding=True leaves the embedding out (the loader takes the target's); only valid for
  tied embeddings, since an untied LM head would still need it stored. The folder is replaced
  whole: it is written next to `path` and renamed into place, so readers never see half of it.
  `extra_config` adds keys to config.json (e.g. the target's eos_token_id).
  """
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")
  cfg = model.cfg
  if share_embedding and not cfg.tie_embeddings:
    raise ValueError("share_embedding=True needs tied embeddings (the head would be unsaved)")
  hf = {**dict(extra_config or {}), **hf_config_of(cfg.with_dtype(dtype))}
  tensors = decoder_to_hf_tensors(model)
  if share_embedding:
    hf[SHARED_EMBEDDING_KEY] = "target"
    del tensors[EMBEDDING_TENSOR]
  np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
  tensors = {k: v.astype(np_dtype) for k, v in tensors.items()}

  return replace_hf_folder(path, hf, tensors, manifest)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
  """The manifest.json of a drafter folder or known name ({} if it has none)."""
  file = resolve_drafter(path) / MANIFEST_FILE
  if not file.is_file():
    return {}
  with open(file) as f:
    return json.load(f)

