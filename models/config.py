"""`ModelConfig`: the static description of a Llama-family decoder, parsed from HF config.json.

One frozen, hashable dataclass covers Llama 2/3.x (incl. llama3 RoPE scaling), Qwen2/2.5
(qkv bias), Qwen3 (q/k RMSNorm), SmolLM2 and Mistral-style GQA. It is hashable so jitted
functions may close over it or take it as a static argument.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from models.errors import UnsupportedArchitectureError

_SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
_MODEL_TYPE_TO_FAMILY = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling. `kind` is "llama3" or "linear"."""

  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape-determining description of the decoder (static under jit)."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-5
  tie_embeddings: bool = True
  qkv_bias: bool = False  # Qwen2, Llama with attention_bias
  o_bias: bool = False  # Llama with attention_bias
  qk_norm: bool = False  # Qwen3
  rope_scaling: RopeScaling | None = None
  max_position_embeddings: int = 8192
  dtype: str = "float32"  # parameters and activations; softmax/norm stats/logits stay fp32

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
    if self.num_heads % self.num_kv_heads:
      raise UnsupportedArchitectureError(
          f"num_attention_heads={self.num_heads} is not a multiple of "
          f"num_key_value_heads={self.num_kv_heads}")
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim"):
      if getattr(self, name) <= 0:
        raise UnsupportedArchitectureError(f"{name} must be positive, got {getattr(self, name)}")

  def with_dtype(self, dtype: str) -> "ModelConfig":
    return dataclasses.replace(self, dtype=dtype)

  @classmethod
  def from_hf_config(cls, hf: Mapping[str, Any], dtype: str = "float32") -> "ModelConfig":
    """Parses a Hugging Face config.json dict; refuses what this decoder does not implement."""
    archs = hf.get("architectures") or []
    model_type = hf.get("model_type")
    family = None
    for arch in archs:
      family = family or _SUPPORTED_ARCHITECTURES.get(arch)
    if family is None:
      family = _MODEL_TYPE_TO_FAMILY.get(model_type)
    if family is None:
      raise UnsupportedArchitectureError(
          f"unsupported architecture {archs or model_type!r} in config.json; supported: "
          f"{sorted(_SUPPORTED_ARCHITECTURES)}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
      raise UnsupportedArchitectureError(f"unsupported hidden_act {act!r} (only 'silu')")
    if hf.get("mlp_bias"):
      raise UnsupportedArchitectureError("mlp_bias=true is not supported")
    if hf.get("use_sliding_window"):
      raise UnsupportedArchitectureError("use_sliding_window=true is not supported")
    if model_type == "mistral" and hf.get("sliding_window"):
      raise UnsupportedArchitectureError("Mistral sliding_window attention is not supported")
    try:
      num_heads = int(hf["num_attention_heads"])
      hidden = int(hf["hidden_size"])
      cfg = dict(
          vocab_size=int(hf["vocab_size"]),
          hidden_size=hidden,
          intermediate_size=int(hf["intermediate_size"]),
          num_layers=int(hf["num_hidden_layers"]),
          num_heads=num_heads,
          num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
          head_dim=int(hf.get("head_dim") or hidden // num_heads),
      )
    except KeyError as e:
      raise UnsupportedArchitectureError(f"config.json is missing required key {e.args[0]!r}")
    rope_params = dict(hf.get("rope_parameters") or {})
    legacy_scaling = hf.get("rope_scaling")
    if legacy_scaling:
      rope_params = {**legacy_scaling, **rope_params}
    rope_theta = float(hf.get("rope_theta") or rope_params.get("rope_theta") or 10000.0)
    return cls(
        **cfg,
        rope_theta=rope_theta,
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family != "llama")),
        qkv_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
        o_bias=family == "llama" and bool(hf.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        rope_scaling=_parse_rope_scaling(rope_params),
        max_position_embeddings=int(hf.get("max_position_embeddings", 8192)),
        dtype=dtype,
    )


def _parse_rope_scaling(params: Mapping[str, Any]) -> RopeScaling | None:
  kind = params.get("rope_type", params.get("type", "default"))
  if kind in (None, "default"):
    return None
  if kind == "llama3":
    return RopeScaling(
        kind="llama3",
        factor=float(params["factor"]),
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(params.get("original_max_position_embeddings", 8192)),
    )
  if kind == "linear":
    return RopeScaling(kind="linear", factor=float(params["factor"]))
  raise UnsupportedArchitectureError(f"unsupported rope scaling type {kind!r} (llama3, linear)")


def rope_scaling_to_hf(s: RopeScaling | None) -> dict[str, Any] | None:
  """The config.json `rope_scaling` entry of `s` (the inverse of parsing it); None if unscaled."""
  if s is None:
    return None
  if s.kind == "linear":
    return {"rope_type": "linear", "factor": s.factor}
  return {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
          "high_freq_factor": s.high_freq_factor,
          "original_max_position_embeddings": s.original_max_position_embeddings}


def rope_inverse_frequencies(cfg: ModelConfig):
  """float64 numpy inverse frequencies [head_dim // 2], with the configured scaling applied."""
  import numpy as np

  inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim))
  s = cfg.rope_scaling
  if s is None:
    return inv_freq
  if s.kind == "linear":
    return inv_freq / s.factor
  # llama3: keep high frequencies, divide low ones by `factor`, interpolate in between.
  low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
  high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
  wavelen = 2 * math.pi / inv_freq
  scaled = np.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
  smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (
      s.high_freq_factor - s.low_freq_factor)
  smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
  medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
  return np.where(medium, smoothed, scaled)
