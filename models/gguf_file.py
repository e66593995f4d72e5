"""Read a llama.cpp GGUF file as Hugging Face-named float32 tensors plus an HF-style config.

Shape convention. GGUF records a tensor's dims in ggml order, fastest-varying first: a Linear
weight with HF shape [out, in] is stored with `shape = [in, out]` (ne0 = in). The bytes are the
same row-major layout as the HF tensor, so `GGUFReader` exposes `tensor.data` with numpy shape
[out, in_bytes] and `gguf.quants.dequantize` returns float32 [out, in]: the HF orientation, with
no transpose. `tensor.shape` (the reversed dims) is only used in error messages.

llama.cpp's converter permutes the rows of Q and K for llama-arch models (its RoPE rotates
adjacent pairs, HF's rotates the two halves of each head); `_unpermute_rows` undoes it. qwen2
and qwen3 are converted without the permutation and load as stored.
"""

from __future__ import annotations

import math
import os
from typing import Any

import gguf
import numpy as np

from models.errors import CheckpointError, UnsupportedArchitectureError

# general.architecture -> (HF architectures entry, HF model_type)
SUPPORTED_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}

_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# Precomputed llama3 RoPE factors; folded back into config["rope_scaling"] instead.
_ROPE_FREQS = "rope_freqs.weight"


def load_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Loads and dequantises a GGUF checkpoint.

  Args:
    path: a `.gguf` file with general.architecture in llama / qwen2 / qwen3.

  Returns:
    (hf_config, tensors): a config.json-style dict and every weight under its HF name in HF
    orientation as float32, e.g. `model.layers.0.self_attn.q_proj.weight` f32[H*Dh, D],
    `model.embed_tokens.weight` f32[V, D]. `lm_head.weight` is absent when the embeddings are
    tied (no `output.weight` in the file; config["tie_word_embeddings"] is then True).

  Raises:
    CheckpointError: missing/corrupt file, unknown tensor, unsupported quantisation type.
    UnsupportedArchitectureError: an architecture or hyper-parameter this decoder lacks.
  """
  reader = open_gguf(path)
  config = gguf_config(reader, path)
  n_heads = config["num_attention_heads"]
  n_kv_heads = config["num_key_value_heads"]
  permuted = config["model_type"] == "llama"
  tensors = {}
  for t in reader.tensors:
    if t.name == _ROPE_FREQS:
      continue
    hf_name = _hf_name(t.name, path)
    w = _dequantize(t, path)
    # llama.cpp permutes q/k biases too (attention_bias=True llamas), with the same rows.
    if permuted and t.name.endswith((".attn_q.weight", ".attn_q.bias")):
      w = _unpermute_rows(w, n_heads, t.name, path)
    elif permuted and t.name.endswith((".attn_k.weight", ".attn_k.bias")):
      w = _unpermute_rows(w, n_kv_heads, t.name, path)
    tensors[hf_name] = w
  return config, tensors


def load_gguf_blocks(path: str | os.PathLike, kinds: tuple[str, ...] = ("Q4_1", "Q8_0")
                     ) -> dict[str, tuple[str, np.ndarray]]:
  """The raw blocks of the quantised matrices, for kernels that compute with them as stored.

  Returns {HF name: (type name, uint8 rows [out, bytes])} for every 2-D tensor whose type is
  in `kinds`, its rows in HF order (Q/K un-permuted like `load_gguf`'s), so that dequantising
  a row gives that row of `load_gguf`'s tensor exactly. Nothing is dequantised.
  """
  reader = open_gguf(path)
  config = gguf_config(reader, path)
  permuted = config["model_type"] == "llama"
  blocks = {}
  for t in reader.tensors:
    if t.tensor_type.name not in kinds or t.data.ndim != 2 or t.name == _ROPE_FREQS:
      continue
    rows = np.asarray(t.data, np.uint8)
    if permuted and t.name.endswith(".attn_q.weight"):
      rows = _unpermute_rows(rows, config["num_attention_heads"], t.name, path)
    elif permuted and t.name.endswith(".attn_k.weight"):
      rows = _unpermute_rows(rows, config["num_key_value_heads"], t.name, path)
    blocks[_hf_name(t.name, path)] = (t.tensor_type.name, rows)
  return blocks


def gguf_config(reader: gguf.GGUFReader, path: str | os.PathLike) -> dict[str, Any]:
  """Builds an HF config.json-style dict from GGUF metadata (no tensor data is read)."""
  arch = _field(reader, "general.architecture", path)
  if arch not in SUPPORTED_ARCHITECTURES:
    raise UnsupportedArchitectureError(
        f"{path}: general.architecture={arch!r} is not supported "
        f"(supported: {', '.join(sorted(SUPPORTED_ARCHITECTURES))})")
  hf_arch, model_type = SUPPORTED_ARCHITECTURES[arch]

  def get(key, default=...):
    return _field(reader, f"{arch}.{key}", path, default)

  hidden = int(get("embedding_length"))
  n_heads = _uniform_int(get("attention.head_count"), f"{arch}.attention.head_count", path)
  n_kv_heads = _uniform_int(get("attention.head_count_kv", n_heads),
                            f"{arch}.attention.head_count_kv", path)
  # qwen3 heads are wider than hidden / n_heads; key_length is the only place that says so.
  head_dim = int(get("attention.key_length", hidden // n_heads))
  rope_dim = int(get("rope.dimension_count", head_dim))
  if rope_dim != head_dim:
    raise UnsupportedArchitectureError(
        f"{path}: {arch}.rope.dimension_count={rope_dim} != head_dim={head_dim} "
        "(partial rotary embeddings are not supported)")
  names = {t.name for t in reader.tensors}
  vocab = get("vocab_size", None)
  if vocab is None:
    vocab = len(_field(reader, "tokenizer.ggml.tokens", path))
  rope_theta = float(get("rope.freq_base", 10000.0))

  config = {
      "architectures": [hf_arch],
      "model_type": model_type,
      "vocab_size": int(vocab),
      "hidden_size": hidden,
      "intermediate_size": int(get("feed_forward_length")),
      "num_hidden_layers": int(get("block_count")),
      "num_attention_heads": n_heads,
      "num_key_value_heads": n_kv_heads,
      "head_dim": head_dim,
      "hidden_act": "silu",
      "rope_theta": rope_theta,
      "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
      "max_position_embeddings": int(get("context_length")),
      "tie_word_embeddings": "output.weight" not in names,
  }
  if model_type == "llama":
    config["attention_bias"] = "blk.0.attn_q.bias" in names
    config["mlp_bias"] = False
  for key in ("bos_token_id", "pad_token_id"):
    value = _field(reader, f"tokenizer.ggml.{key}", path, None)
    if value is not None:
      config[key] = int(value)
  # Chat models stop on end-of-turn; llama.cpp keeps that id apart from eos (e.g. Llama 3).
  eos = [int(v) for k in ("eos_token_id", "eot_token_id", "eom_token_id")
         if (v := _field(reader, f"tokenizer.ggml.{k}", path, None)) is not None]
  eos = list(dict.fromkeys(eos))
  if eos:
    config["eos_token_id"] = eos[0] if len(eos) == 1 else eos

  rope_scaling = _rope_scaling(reader, arch, path)
  if _ROPE_FREQS in names:
    if rope_scaling is not None:
      raise UnsupportedArchitectureError(
          f"{path}: both {arch}.rope.scaling.type and {_ROPE_FREQS} are present")
    factors = _dequantize(next(t for t in reader.tensors if t.name == _ROPE_FREQS), path)
    rope_scaling = _fit_llama3_rope(factors.reshape(-1), rope_theta, head_dim, path)
  if rope_scaling is not None:
    config["rope_scaling"] = rope_scaling
  return config


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
  """The file's reader (metadata and tensor index); a missing or corrupt file is a
  CheckpointError."""
  if not os.path.isfile(path):
    raise CheckpointError(f"GGUF file {path} does not exist")
  try:
    return gguf.GGUFReader(path)
  # The reader parses with raw numpy/struct reads; a bad file surfaces as any of these.
  except (ValueError, IndexError, KeyError, OSError, EOFError, TypeError) as e:
    raise CheckpointError(f"GGUF file {path} is corrupt or truncated: {e}") from e


def _field(reader: gguf.GGUFReader, key: str, path, default: Any = ...) -> Any:
  field = reader.get_field(key)
  if field is None:
    if default is ...:
      raise CheckpointError(f"{path}: GGUF metadata key {key!r} is missing")
    return default
  value = field.contents()
  if field.types == [gguf.GGUFValueType.FLOAT32]:
    # Shortest decimal that round-trips float32: 1e-05 as in config.json, not 9.9999997e-06.
    value = float(str(np.float32(value)))
  return value


def _uniform_int(value, key: str, path) -> int:
  """Per-layer arrays (hybrid models) are allowed only when every layer agrees."""
  if isinstance(value, list):
    if not value or len(set(value)) != 1:
      raise UnsupportedArchitectureError(f"{path}: per-layer {key}={value} is not supported")
    value = value[0]
  return int(value)


def _hf_name(name: str, path) -> str:
  if name in _GLOBAL_TENSORS:
    return _GLOBAL_TENSORS[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
    return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}"
  raise CheckpointError(f"{path}: GGUF tensor {name!r} has no Hugging Face counterpart")


def _dequantize(t, path) -> np.ndarray:
  """Returns a float32 array shaped like `t.data`'s rows, i.e. [out, in] for matrices."""
  try:
    w = gguf.quants.dequantize(t.data, t.tensor_type)
  except NotImplementedError as e:
    raise CheckpointError(
        f"{path}: tensor {t.name!r} has quantisation type {t.tensor_type.name}, "
        "which gguf cannot dequantise") from e
  # F32 comes back as a view of the read-only file mapping; own the memory.
  if np.may_share_memory(w, t.data):
    w = np.array(w, dtype=np.float32)
  return np.asarray(w, dtype=np.float32)


def _unpermute_rows(w: np.ndarray, n_head: int, name: str, path) -> np.ndarray:
  """Inverse of llama.cpp `LlamaModel.permute`.

  llama.cpp: w.reshape(n_head, 2, R // n_head // 2, *rest).swapaxes(1, 2).reshape(w.shape),
  which interleaves the two halves of each head's rows; this de-interleaves them.
  Works for weights f32[R, D] and biases f32[R].
  """
  rows = w.shape[0]
  if rows % (2 * n_head):
    raise CheckpointError(f"{path}: tensor {name!r} has {rows} rows, not {n_head} heads of "
                          "an even size")
  return (w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def _rope_scaling(reader, arch: str, path) -> dict[str, Any] | None:
  kind = _field(reader, f"{arch}.rope.scaling.type", path, None)
  if kind in (None, "none"):
    return None
  if kind not in ("linear", "yarn"):
    raise UnsupportedArchitectureError(f"{path}: {arch}.rope.scaling.type={kind!r} is not supported")
  scaling = {"rope_type": kind, "factor": float(_field(reader, f"{arch}.rope.scaling.factor", path))}
  original = _field(reader, f"{arch}.rope.scaling.original_context_length", path, None)
  if original is not None:
    scaling["original_max_position_embeddings"] = int(original)
  return scaling


def _llama3_factors(theta, head_dim, factor, low, high, original) -> np.ndarray:
  """llama.cpp's per-frequency divisors for llama3 RoPE scaling, f32[head_dim // 2]."""
  inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  wavelen = 2 * math.pi / inv_freq
  smooth = (original / wavelen - low) / (high - low)
  mid = 1.0 / ((1 - smooth) / factor + smooth)
  return np.where(wavelen < original / high, 1.0,
                  np.where(wavelen > original / low, factor, mid))


def _fit_llama3_rope(factors: np.ndarray, theta: float, head_dim: int, path) -> dict[str, Any]:
  """Recovers HF's llama3 `rope_scaling` from llama.cpp's precomputed `rope_freqs` tensor.

  GGUF stores only the resulting divisors. In the smooth band 1/f is affine in 1/wavelen, which
  pins high_freq_factor and original_max_position_embeddings once low_freq_factor is fixed;
  every released Llama 3.x uses low_freq_factor=1 and the fit is checked by regenerating the
  divisors, so a different schedule is an error rather than a silent RoPE mismatch.
  """
  factor = float(factors.max())
  scaling = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
             "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
  inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  x = inv_freq / (2 * math.pi)  # 1 / wavelen
  f = factors.astype(np.float64)
  band = (f > 1 + 1e-6) & (f < factor - 1e-6)
  if factor > 1 and band.sum() >= 2:
    smooth = (1 / f[band] - 1 / factor) / (1 - 1 / factor)
    a, b = np.polyfit(x[band], smooth, 1)  # smooth = original/(h-1) * x - 1/(h-1)
    high = 1 - 1 / b
    scaling["high_freq_factor"] = float(round(high, 4))
    scaling["original_max_position_embeddings"] = int(round(-a / b))
  expected = _llama3_factors(theta, head_dim, factor, scaling["low_freq_factor"],
                             scaling["high_freq_factor"], scaling["original_max_position_embeddings"])
  if factors.shape != expected.shape or not np.allclose(factors, expected, rtol=1e-4):
    raise UnsupportedArchitectureError(
        f"{path}: {_ROPE_FREQS} does not match a llama3 RoPE scaling schedule")
  return scaling
