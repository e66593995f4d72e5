"""`ModelConfig`: the static description of a Llama-family decoder, parsed from HF config.json.

One frozen, hashable dataclass covers Llama 2/3.x (incl. llama3 RoPE scaling), Qwen2/2.5
(qkv bias), Qwen3 (q/k RMSNorm), SmolLM2 and Mistral-style GQA. It is hashable so jitted
functions may close over it or take it as a static argument.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
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
# config.json's names for the fields whose names differ, so errors say what the file says.
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads"}


def _label(field: str) -> str:
  return f"{field} ({_HF_KEYS[field]})" if field in _HF_KEYS else field


def _check_positive_int(name: str, value) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
    raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_positive_real(name: str, value) -> None:
  """Finite and > 0: NaN, inf, 0 or a sign flip would reach RoPE / RMSNorm as garbage."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not math.isfinite(value) or value <= 0):
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
  """RoPE frequency scaling. `kind` is "llama3" or "linear"."""

  kind: str
  factor: float
  low_freq_factor: float = 1.0
  high_freq_factor: float = 4.0
  original_max_position_embeddings: int = 8192

  def __post_init__(self):
    if self.kind not in ("llama3", "linear"):
      raise ValueError(f"rope_scaling kind must be 'llama3' or 'linear', got {self.kind!r}")
    _check_positive_real("rope_scaling.factor", self.factor)
    if self.kind == "llama3":
      _check_positive_real("rope_scaling.low_freq_factor", self.low_freq_factor)
      _check_positive_real("rope_scaling.high_freq_factor", self.high_freq_factor)
      # The smooth band divides by their difference (transformers requires low < high too).
      if self.high_freq_factor <= self.low_freq_factor:
        raise ValueError(f"rope_scaling.high_freq_factor ({self.high_freq_factor!r}) must be "
                         f"greater than low_freq_factor ({self.low_freq_factor!r})")
      _check_positive_int("rope_scaling.original_max_position_embeddings",
                          self.original_max_position_embeddings)


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
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                 "num_kv_heads", "head_dim", "max_position_embeddings"):
      _check_positive_int(_label(name), getattr(self, name))
    if self.num_heads % self.num_kv_heads:
      raise UnsupportedArchitectureError(
          f"num_attention_heads={self.num_heads} is not a multiple of "
          f"num_key_value_heads={self.num_kv_heads}")
    _check_positive_real("rope_theta", self.rope_theta)
    eps = self.rms_norm_eps
    if (isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not math.isfinite(eps)
        or eps < 0):
      raise ValueError(f"rms_norm_eps must be a finite number >= 0, got {eps!r}")

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
    num_heads = _hf_int(hf, "num_attention_heads")
    hidden = _hf_int(hf, "hidden_size")
    cfg = dict(
        vocab_size=_hf_int(hf, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_hf_int(hf, "intermediate_size"),
        num_layers=_hf_int(hf, "num_hidden_layers"),
        num_heads=num_heads,
        num_kv_heads=_hf_int(hf, "num_key_value_heads", num_heads),
        head_dim=_hf_int(hf, "head_dim", hidden // num_heads),
    )
    rope_params = dict(hf.get("rope_parameters") or {})
    legacy_scaling = hf.get("rope_scaling")
    if legacy_scaling:
      rope_params = {**legacy_scaling, **rope_params}
    # Absent or null means the default; a value the file states (even 0) is checked, not replaced.
    rope_theta = hf.get("rope_theta")
    if rope_theta is None:
      rope_theta = rope_params.get("rope_theta")
    return cls(
        **cfg,
        rope_theta=_hf_real(rope_theta, "rope_theta", 10000.0),
        rms_norm_eps=_hf_real(hf.get("rms_norm_eps"), "rms_norm_eps", 1e-6),
        tie_embeddings=bool(hf.get("tie_word_embeddings", family != "llama")),
        qkv_bias=family == "qwen2" or bool(hf.get("attention_bias", False)),
        o_bias=family == "llama" and bool(hf.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        rope_scaling=_parse_rope_scaling(rope_params),
        max_position_embeddings=_hf_int(hf, "max_position_embeddings", 8192),
        dtype=dtype,
    )


_REQUIRED = object()


def _hf_int(hf: Mapping[str, Any], key: str, default: Any = _REQUIRED, where: str = "") -> int:
  """config.json's `key` as a positive int (`default` when absent or null). 49152.9 would
  otherwise truncate silently; 0 heads would divide by zero."""
  value = hf.get(key)
  if value is None:
    if default is _REQUIRED:
      raise UnsupportedArchitectureError(f"config.json is missing required key {key!r}")
    return default
  if isinstance(value, float) and value.is_integer():
    value = int(value)  # 576.0: a JSON writer's integer
  _check_positive_int(f"config.json {where}{key}", value)
  return int(value)


def _hf_real(value: Any, name: str, default: float) -> float:
  """A number from config.json (`default` when absent or null); range checks are the
  dataclass's. Refuses strings and booleans, which float() would accept or mangle."""
  if value is None:
    return default
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"config.json {name} must be a number, got {value!r}")
  return float(value)


def _parse_rope_scaling(params: Mapping[str, Any]) -> RopeScaling | None:
  kind = params.get("rope_type", params.get("type", "default"))
  if kind in (None, "default"):
    return None
  if kind not in ("llama3", "linear"):
    raise UnsupportedArchitectureError(f"unsupported rope scaling type {kind!r} (llama3, linear)")
  factor = params.get("factor")
  if factor is None:
    raise ValueError(f"rope_scaling of type {kind!r} needs a 'factor', got {dict(params)!r}")
  factor = _hf_real(factor, "rope_scaling.factor", 1.0)
  if kind == "linear":
    return RopeScaling(kind="linear", factor=factor)
  return RopeScaling(
      kind="llama3",
      factor=factor,
      low_freq_factor=_hf_real(params.get("low_freq_factor"), "rope_scaling.low_freq_factor",
                               1.0),
      high_freq_factor=_hf_real(params.get("high_freq_factor"), "rope_scaling.high_freq_factor",
                                4.0),
      original_max_position_embeddings=_hf_int(params, "original_max_position_embeddings", 8192,
                                               where="rope_scaling."),
  )


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
