"""EAGLE-3 and Medusa drafter folders: config.json + model.safetensors (+ manifest.json).

config.json carries `"asd_jax_drafter": "eagle3" | "medusa"`. Tensors are float32 or
bfloat16; the target's embedding (EAGLE-3) and the target's LM head (shared Medusa heads) are
not stored: the loader takes them from the target and checks that they fit.

EAGLE-3 folders use the layout vLLM and SGLang load (`LlamaForCausalLMEagle3`), so a folder
written here serves there as is. Followed:
- vLLM `vllm/model_executor/models/llama_eagle3.py` (`load_weights`): tensors `midlayer.*`
  (renamed to layers.0), `fc.weight`, `norm.weight`, `lm_head.weight` [Vd, D], `d2t` (int64
  offsets), `t2d` (bool [Vt], skipped by vLLM), `embed_tokens.weight` optional (else the
  target's is shared); config `draft_vocab_size`, `vocab_size` = target vocab, optional
  `target_hidden_size`, `eagle_config.use_aux_hidden_state`.
- SGLang `python/sglang/srt/models/llama_eagle3.py`: same names; `tie_word_embeddings` must be
  false (true makes SGLang use the embedding as the head); `bias` would add an fc bias.
- Config keys as in yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (SpecForge `configs/llama3-8B-eagle3.json`):
  architectures ["LlamaForCausalLMEagle3"], num_hidden_layers 1, vocab_size, draft_vocab_size.
- Fused-layer ids disagree between the engines: vLLM reads top-level
  `eagle_aux_hidden_state_layer_ids` first and captures the *input* of those layers; SGLang
  reads `eagle_config.eagle_aux_hidden_state_layer_ids` and adds 1 (ids are layer outputs,
  SpecForge's convention). Non-default layers are written in both places, each in its
  reader's convention; default layers are left implicit (both engines default alike).

Medusa tensors keep Medusa's names: `medusa_head.{m}.0.linear.weight|bias` (the ResBlock) and,
with own heads, `medusa_head.{m}.1.weight` [V, D].
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import flax.nnx as nnx
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from models.config import ModelConfig, rope_inverse_frequencies, rope_scaling_to_hf
from models.drafter_folder import SHARED_EMBEDDING_KEY
from models.eagle3 import Eagle3Config, Eagle3Drafter, check_vocab_map, eagle3_default_layers
from models.errors import CheckpointError, UnsupportedArchitectureError
from models.hf_folder import load_hf_folder, replace_hf_folder
from models.hf_params import resolve_attr
from models.medusa import MedusaConfig, MedusaHeads

DRAFTER_KEY = "asd_jax_drafter"
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
_EMBED = "embed_tokens.weight"

# (HF name, attribute path in Eagle3Drafter, transpose [out, in] <-> kernel [in, out])
_EAGLE3_TENSORS = (
    ("fc.weight", "fc.kernel", True),
    ("midlayer.input_layernorm.weight", "layer.input_norm.scale", False),
    ("midlayer.hidden_norm.weight", "layer.hidden_norm.scale", False),
    ("midlayer.post_attention_layernorm.weight", "layer.post_attn_norm.scale", False),
    *((f"midlayer.self_attn.{p}.weight", f"layer.attn.{p}.kernel", True)
      for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    *((f"midlayer.mlp.{p}.weight", f"layer.mlp.{p}.kernel", True)
      for p in ("gate_proj", "up_proj", "down_proj")),
    ("norm.weight", "final_norm.scale", False),
    ("lm_head.weight", "lm_head.kernel", True),
)


def save_drafter(path: str | os.PathLike, drafter: Eagle3Drafter | MedusaHeads,
                 dtype: str = "bfloat16", share_embedding: bool = True,
                 manifest: Mapping[str, Any] | None = None) -> Path:
  """Writes an EAGLE-3 or Medusa drafter folder, replacing `path` whole (atomic rename).

  share_embedding=False stores the EAGLE-3 drafter's embedding too (ignored for Medusa).
  """
  _check_dtype(dtype)
  if isinstance(drafter, Eagle3Drafter):
    hf, tensors = _eagle3_folder(drafter, dtype, include_embedding=not share_embedding)
    hf[DRAFTER_KEY] = "eagle3"
    if share_embedding:
      hf[SHARED_EMBEDDING_KEY] = "target"
  elif isinstance(drafter, MedusaHeads):
    hf, tensors = _medusa_folder(drafter, dtype)
  else:
    raise TypeError(f"not a drafter: {type(drafter).__name__}")
  return replace_hf_folder(path, hf, tensors, manifest)


def export_eagle3(path: str | os.PathLike, drafter: Eagle3Drafter, dtype: str = "bfloat16",
                  include_embedding: bool = False) -> Path:
  """Writes `drafter` for vLLM / SGLang (`--speculative-config '{"method": "eagle3", ...}'`).

  Without the embedding both engines share the target's, as this repo does.
  """
  if not isinstance(drafter, Eagle3Drafter):
    raise TypeError(f"export_eagle3 needs an EAGLE-3 drafter, got {type(drafter).__name__}")
  _check_dtype(dtype)
  hf, tensors = _eagle3_folder(drafter, dtype, include_embedding)
  return replace_hf_folder(path, hf, tensors)


def load_drafter(path: str | os.PathLike, target, dtype: str = "float32"):
  """Loads a folder from `save_drafter` / `export_eagle3`, or any `LlamaForCausalLMEagle3`
  folder, as an `Eagle3Drafter` or `MedusaHeads` of `dtype`.

  Args:
    target: the target Decoder (or LoadedModel): supplies the shared embedding, and its
      width, vocabulary and depth must be the ones the drafter was made for.

  Raises:
    CheckpointError: missing/mis-shaped tensors, or a drafter made for another target.
    UnsupportedArchitectureError: an EAGLE-3 variant this module does not implement.
  """
  _check_dtype(dtype)
  folder = Path(path)
  hf, tensors = load_hf_folder(folder)
  kind = hf.get(DRAFTER_KEY)
  if kind == "medusa":
    return _medusa_from(folder, hf, tensors, _target_decoder(target), dtype)
  if kind == "eagle3" or (kind is None and EAGLE3_ARCH in (hf.get("architectures") or [])):
    return _eagle3_from(folder, hf, tensors, _target_decoder(target), dtype)
  raise CheckpointError(f"{folder}/config.json: not a drafter folder ({DRAFTER_KEY}={kind!r}, "
                        f"architectures={hf.get('architectures')!r})")


def import_eagle3(path: str | os.PathLike, target, dtype: str = "float32") -> Eagle3Drafter:
  """Loads an EAGLE-3 folder in the vLLM / SGLang layout (e.g. from SpecForge or the EAGLE
  reference code); the same reader as `load_drafter`, which also takes this layout."""
  drafter = load_drafter(path, target, dtype)
  if not isinstance(drafter, Eagle3Drafter):
    raise CheckpointError(f"{path}: a {type(drafter).__name__} folder, not EAGLE-3")
  return drafter


# --- EAGLE-3 ---------------------------------------------------------------------------------


def eagle3_hf_config(cfg: Eagle3Config, dtype: str) -> dict[str, Any]:
  """The `LlamaForCausalLMEagle3` config.json of a drafter (plus asd_jax's exact layer keys)."""
  hf = {
      "architectures": [EAGLE3_ARCH], "model_type": "llama", "hidden_act": "silu",
      "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
      "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
      "head_dim": cfg.head_dim, "num_hidden_layers": 1, "rms_norm_eps": cfg.rms_norm_eps,
      "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
      "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
      "vocab_size": cfg.target_vocab_size, "draft_vocab_size": cfg.draft_vocab_size,
      "torch_dtype": dtype, "eagle_config": {"use_aux_hidden_state": True},
      "asd_jax_fused_layers": list(cfg.fused_layers),
      "asd_jax_target_num_layers": cfg.target_num_layers,
  }
  if cfg.fused_layers != eagle3_default_layers(cfg.target_num_layers):
    hf["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in cfg.fused_layers]  # vLLM
    hf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(cfg.fused_layers)  # SGLang
  if cfg.rope_scaling is not None:
    hf["rope_scaling"] = rope_scaling_to_hf(cfg.rope_scaling)
  return hf


def _eagle3_folder(drafter: Eagle3Drafter, dtype: str, include_embedding: bool):
  tensors = {}
  for name, attr, transpose in _EAGLE3_TENSORS:
    value = np.asarray(resolve_attr(drafter, attr)[...], np.float32)
    tensors[name] = _cast(value.T if transpose else value, dtype)
  if include_embedding:
    tensors[_EMBED] = _cast(np.asarray(drafter.embed.embedding[...], np.float32), dtype)
  tensors["d2t"] = np.asarray(drafter.d2t[...], np.int64)
  tensors["t2d"] = np.asarray(drafter.t2d[...], bool)
  return eagle3_hf_config(drafter.cfg, dtype), tensors


def _eagle3_config_from(folder, hf, target_cfg: ModelConfig, dtype: str) -> Eagle3Config:
  where = f"{folder}/config.json"
  if int(hf.get("num_hidden_layers", 1)) != 1:
    raise UnsupportedArchitectureError(f"{where}: num_hidden_layers="
                                       f"{hf['num_hidden_layers']}; only 1-layer EAGLE-3")
  for key in ("norm_before_residual", "attention_bias", "bias"):
    if hf.get(key):
      raise UnsupportedArchitectureError(f"{where}: {key}=true is not supported")
  eagle = hf.get("eagle_config") or {}
  if not eagle.get("use_aux_hidden_state", True):
    raise UnsupportedArchitectureError(f"{where}: use_aux_hidden_state=false is not supported")
  layer = ModelConfig.from_hf_config(hf, dtype=dtype)  # heads, RoPE, eps; refuses the exotic
  width = int(hf.get("target_hidden_size") or layer.hidden_size)
  if layer.hidden_size != width:
    raise UnsupportedArchitectureError(f"{where}: target_hidden_size={width} differs from "
                                       f"hidden_size={layer.hidden_size}; not supported")
  if (width, layer.vocab_size) != (target_cfg.hidden_size, target_cfg.vocab_size):
    raise CheckpointError(
        f"{folder}: an EAGLE-3 drafter for a target of width {width} and vocabulary "
        f"{layer.vocab_size}, but this target has width {target_cfg.hidden_size} and vocabulary "
        f"{target_cfg.vocab_size}: a drafter for another target?")
  num_layers = int(hf.get("asd_jax_target_num_layers") or target_cfg.num_layers)
  if num_layers != target_cfg.num_layers:
    raise CheckpointError(f"{folder}: drafter made for a {num_layers}-layer target, this target "
                          f"has {target_cfg.num_layers} layers")
  if hf.get("asd_jax_fused_layers") is not None:
    fused = hf["asd_jax_fused_layers"]
  elif hf.get("eagle_aux_hidden_state_layer_ids"):  # vLLM: inputs of these layers
    fused = [i - 1 for i in hf["eagle_aux_hidden_state_layer_ids"]]
  elif eagle.get("eagle_aux_hidden_state_layer_ids"):  # SGLang / SpecForge: layer outputs
    fused = eagle["eagle_aux_hidden_state_layer_ids"]
  else:
    fused = None
  try:
    return Eagle3Config(
        hidden_size=width, target_vocab_size=layer.vocab_size,
        draft_vocab_size=int(hf.get("draft_vocab_size") or layer.vocab_size),
        num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads, head_dim=layer.head_dim,
        intermediate_size=layer.intermediate_size, target_num_layers=num_layers,
        fused_layers=fused, rms_norm_eps=layer.rms_norm_eps, rope_theta=layer.rope_theta,
        rope_scaling=layer.rope_scaling, max_position_embeddings=layer.max_position_embeddings,
        dtype=dtype)
  except ValueError as e:
    raise CheckpointError(f"{where}: {e}") from e


def _eagle3_from(folder, hf, tensors, target, dtype: str) -> Eagle3Drafter:
  cfg = _eagle3_config_from(folder, hf, target.cfg, dtype)
  # Some exporters prefix the drafter's tensors with "model." (vLLM and SGLang accept both).
  tensors = {k.removeprefix("model."): v for k, v in tensors.items()}
  model = nnx.eval_shape(lambda: Eagle3Drafter(cfg, nnx.Rngs(0)))
  for name, attr, transpose in _EAGLE3_TENSORS:
    _set(model, attr, _tensor(folder, tensors, name), transpose, dtype, folder, name)
  if _EMBED in tensors:
    _set(model, "embed.embedding", tensors[_EMBED], False, dtype, folder, _EMBED)
  else:
    # Same dtype: the drafter holds the target's buffer, not a copy.
    model.embed.embedding.set_value(jnp.asarray(target.embed.embedding[...], jnp.dtype(dtype)))
  vd, vt = cfg.draft_vocab_size, cfg.target_vocab_size
  if "d2t" in tensors:
    d2t = np.asarray(tensors["d2t"])
  elif vd == vt:
    d2t = np.zeros(vd, np.int64)
  else:
    raise CheckpointError(f"{folder}: draft_vocab_size={vd} < vocab_size={vt} but no 'd2t'")
  if "t2d" in tensors:
    t2d = np.asarray(tensors["t2d"]).astype(bool)
  else:  # vLLM and SGLang never read it; derive it so checkpoints without it load too
    t2d = np.zeros(vt, bool)
    t2d[np.clip(np.arange(vd) + d2t, 0, vt - 1)] = True
  try:
    check_vocab_map(d2t, t2d, cfg)
  except ValueError as e:
    raise CheckpointError(f"{folder}: {e}") from e
  model.d2t.set_value(jnp.asarray(d2t, jnp.int32))
  model.t2d.set_value(jnp.asarray(t2d))
  model.inv_freq.set_value(
      jnp.asarray(rope_inverse_frequencies(cfg.layer_config()), jnp.float32))
  return model


# --- Medusa ----------------------------------------------------------------------------------


def _medusa_folder(heads: MedusaHeads, dtype: str):
  cfg = heads.cfg
  hf = {DRAFTER_KEY: "medusa", "hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size,
        "medusa_num_heads": cfg.num_heads, "medusa_num_layers": 1,
        "asd_jax_medusa_own_head": cfg.own_head, "torch_dtype": dtype}
  kernel = np.asarray(heads.res.kernel[...], np.float32)
  bias = np.asarray(heads.res.bias[...], np.float32)
  tensors = {}
  for m in range(cfg.num_heads):
    tensors[f"medusa_head.{m}.0.linear.weight"] = _cast(kernel[m].T, dtype)
    tensors[f"medusa_head.{m}.0.linear.bias"] = _cast(bias[m], dtype)
    if cfg.own_head:
      tensors[f"medusa_head.{m}.1.weight"] = _cast(
          np.asarray(heads.own_head.kernel[m], np.float32).T, dtype)
  return hf, tensors


def _medusa_from(folder, hf, tensors, target, dtype: str) -> MedusaHeads:
  try:
    cfg = MedusaConfig(hidden_size=int(hf["hidden_size"]), vocab_size=int(hf["vocab_size"]),
                       num_heads=int(hf["medusa_num_heads"]),
                       own_head=bool(hf.get("asd_jax_medusa_own_head", False)), dtype=dtype)
  except (KeyError, ValueError) as e:
    raise CheckpointError(f"{folder}/config.json: bad Medusa config: {e!r}") from e
  if int(hf.get("medusa_num_layers", 1)) != 1:
    raise UnsupportedArchitectureError(f"{folder}: medusa_num_layers="
                                       f"{hf['medusa_num_layers']}; only 1 ResBlock per head")
  t = target.cfg
  if (cfg.hidden_size, cfg.vocab_size) != (t.hidden_size, t.vocab_size):
    raise CheckpointError(
        f"{folder}: Medusa heads for a target of width {cfg.hidden_size} and vocabulary "
        f"{cfg.vocab_size}, but this target has width {t.hidden_size} and vocabulary "
        f"{t.vocab_size}: heads for another target?")
  model = nnx.eval_shape(lambda: MedusaHeads(cfg, nnx.Rngs(0)))

  def stacked(fmt, transpose):
    values = [_tensor(folder, tensors, fmt.format(m)) for m in range(cfg.num_heads)]
    return np.stack([v.T if transpose else v for v in values])

  _set(model, "res.kernel", stacked("medusa_head.{}.0.linear.weight", True), False, dtype,
       folder, "medusa_head.*.0.linear.weight")
  _set(model, "res.bias", stacked("medusa_head.{}.0.linear.bias", False), False, dtype, folder,
       "medusa_head.*.0.linear.bias")
  if cfg.own_head:
    _set(model, "own_head.kernel", stacked("medusa_head.{}.1.weight", True), False, dtype,
         folder, "medusa_head.*.1.weight")
  return model


# --- shared helpers --------------------------------------------------------------------------


def _target_decoder(target):
  model = getattr(target, "model", target)  # LoadedModel -> Decoder
  if not (hasattr(model, "cfg") and hasattr(model, "embed")):
    raise TypeError(f"target must be a Decoder or LoadedModel, got {type(target).__name__}")
  return model


def _check_dtype(dtype: str) -> None:
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"dtype must be float32 or bfloat16, got {dtype!r}")


def _cast(value: np.ndarray, dtype: str) -> np.ndarray:
  return value.astype(ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32)


def _tensor(folder, tensors, name: str) -> np.ndarray:
  if name not in tensors:
    raise CheckpointError(f"{folder}: missing tensor {name!r}")
  return np.asarray(tensors[name])


def _set(model, attr: str, value: np.ndarray, transpose: bool, dtype: str, folder, name: str):
  value = value.T if transpose else value
  var = resolve_attr(model, attr)
  if tuple(value.shape) != tuple(var.shape):
    raise CheckpointError(f"{folder}: tensor {name!r} has shape {tuple(value.shape)}, this "
                          f"config expects {tuple(var.shape)}")
  var.set_value(jnp.asarray(value, jnp.dtype(dtype)))

