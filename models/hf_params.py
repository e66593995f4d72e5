"""Hugging Face tensor names <-> the NNX `Decoder`'s parameters.

Loaders (models/hf_folder.py, models/gguf_file.py) return tensors under HF names and HF
orientation ([out, in] for linear layers); this module is the single place that knows how
those names map onto the Flax modules, in both directions.
"""

from __future__ import annotations

from typing import Mapping

import flax.nnx as nnx
import jax.numpy as jnp
import numpy as np

from models.block_quant import Q4_1_COLUMNS, pack_q4_1, pack_q8_0
from models.config import ModelConfig
from models.errors import CheckpointError
from models.llama import Decoder, WeightBlocks

# (HF suffix under model.layers.{i}., attribute path inside DecoderLayer, transpose?)
_LAYER_TENSORS = (
    ("input_layernorm.weight", "input_norm.scale", False),
    ("post_attention_layernorm.weight", "post_attn_norm.scale", False),
    ("self_attn.q_proj.weight", "attn.q_proj.kernel", True),
    ("self_attn.k_proj.weight", "attn.k_proj.kernel", True),
    ("self_attn.v_proj.weight", "attn.v_proj.kernel", True),
    ("self_attn.o_proj.weight", "attn.o_proj.kernel", True),
    ("mlp.gate_proj.weight", "mlp.gate_proj.kernel", True),
    ("mlp.up_proj.weight", "mlp.up_proj.kernel", True),
    ("mlp.down_proj.weight", "mlp.down_proj.kernel", True),
)
_QKV_BIAS = (("self_attn.q_proj.bias", "attn.q_proj.bias"),
             ("self_attn.k_proj.bias", "attn.k_proj.bias"),
             ("self_attn.v_proj.bias", "attn.v_proj.bias"))
_QK_NORM = (("self_attn.q_norm.weight", "attn.q_norm.scale"),
            ("self_attn.k_norm.weight", "attn.k_norm.scale"))


def _tensor_map(cfg: ModelConfig):
  """Yields (hf_name, module path from the Decoder, transpose) for every parameter."""
  yield "model.embed_tokens.weight", "embed.embedding", False
  yield "model.norm.weight", "final_norm.scale", False
  if not cfg.tie_embeddings:
    yield "lm_head.weight", "lm_head.kernel", True
  for i in range(cfg.num_layers):
    pre = f"model.layers.{i}."
    for hf, path, t in _LAYER_TENSORS:
      yield pre + hf, f"layers.{i}.{path}", t
    if cfg.qkv_bias:
      for hf, path in _QKV_BIAS:
        yield pre + hf, f"layers.{i}.{path}", False
    if cfg.o_bias:
      yield pre + "self_attn.o_proj.bias", f"layers.{i}.attn.o_proj.bias", False
    if cfg.qk_norm:
      for hf, path in _QK_NORM:
        yield pre + hf, f"layers.{i}.{path}", False


def resolve_attr(model, path: str) -> nnx.Variable:
  """model.a.3.b for path 'a.3.b' (digits index lists)."""
  obj = model
  for part in path.split("."):
    obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
  return obj


def decoder_from_hf_tensors(cfg: ModelConfig, tensors: Mapping[str, np.ndarray],
                            source: str = "checkpoint") -> Decoder:
  """Builds a `Decoder` whose parameters are the given HF-named tensors (cast to cfg.dtype).

  Raises CheckpointError naming the first missing tensor or shape mismatch, or the tensors
  the config has no place for (a config.json that does not describe these weights).
  """
  _check_names(cfg, tensors, source)
  model = nnx.eval_shape(lambda: Decoder(cfg, nnx.Rngs(0)))
  dtype = jnp.dtype(cfg.dtype)
  for hf_name, path, transpose in _tensor_map(cfg):
    value = np.asarray(tensors[hf_name])
    if transpose:
      value = value.T
    var = resolve_attr(model, path)
    if tuple(value.shape) != tuple(var.shape):
      raise CheckpointError(f"{source}: tensor {hf_name!r} has shape {tuple(value.shape)}, "
                            f"this config expects {tuple(var.shape)} (checkpoint of another model?)")
    var.set_value(jnp.asarray(value, dtype))
  model.inv_freq.set_value(_inv_freq(cfg))
  return model


def _ignorable(name: str, cfg: ModelConfig) -> bool:
  """Tensors real checkpoints carry that the decoder has no place for, by design."""
  # Older Llama checkpoints saved the RoPE buffer; the decoder computes it from the config.
  if name.endswith("rotary_emb.inv_freq"):
    return True
  # Some tied checkpoints also store the head; transformers ties it to the embedding anyway.
  return name == "lm_head.weight" and cfg.tie_embeddings


def _check_names(cfg: ModelConfig, tensors: Mapping[str, np.ndarray], source: str) -> None:
  """Refuses a missing tensor, then any left over: a leftover means the config describes
  another model (e.g. num_hidden_layers=29 over 30 layers), which would run as garbage."""
  wanted = [hf_name for hf_name, _, _ in _tensor_map(cfg)]
  for hf_name in wanted:
    if hf_name not in tensors:
      raise CheckpointError(f"{source}: missing tensor {hf_name!r}")
  wanted = set(wanted)
  unused = sorted(n for n in tensors if n not in wanted and not _ignorable(n, cfg))
  if unused:
    shown = ", ".join(repr(n) for n in unused[:3]) + (", ..." if len(unused) > 3 else "")
    raise CheckpointError(
        f"{source}: {len(unused)} tensor(s) unused by config.json ({shown}): the config "
        f"(num_hidden_layers={cfg.num_layers}) does not describe these weights")


def _inv_freq(cfg: ModelConfig):
  from models.config import rope_inverse_frequencies
  return jnp.asarray(rope_inverse_frequencies(cfg), jnp.float32)


def decoder_to_hf_tensors(model: Decoder) -> dict[str, np.ndarray]:
  """Inverse of `decoder_from_hf_tensors` (float32 numpy, HF orientation)."""
  out = {}
  for hf_name, path, transpose in _tensor_map(model.cfg):
    value = np.asarray(resolve_attr(model, path)[...], np.float32)
    out[hf_name] = value.T if transpose else value
  return out


def attach_weight_blocks(model: Decoder, blocks: Mapping[str, tuple[str, np.ndarray]]) -> int:
  """Gives the decoder's projections and tied head the checkpoint's quantised blocks.

  `blocks` is `models.gguf_file.load_gguf_blocks`'s {HF name: (type, raw rows)}. Q4_1 Linear
  weights and a Q8_0 tied embedding are packed for the native kernels (models/block_quant.py);
  any other type, shape or place keeps only its float32 Param. Only float32 decoders compute
  with blocks (they stand for float32 weights). Returns how many weights were attached.
  """
  if jnp.dtype(model.cfg.dtype) != jnp.float32:
    return 0
  attached = 0
  for hf_name, path, transpose in _tensor_map(model.cfg):
    if hf_name not in blocks:
      continue
    kind, rows = blocks[hf_name]
    var = resolve_attr(model, path)
    if path.endswith(".kernel") and transpose and kind == "Q4_1":
      k, n = var.shape
      try:
        records = pack_q4_1(rows, k)
      except ValueError:
        continue  # e.g. N not a multiple of 32: the float32 kernel path serves it
      if records.records.shape[1] * Q4_1_COLUMNS != n:
        raise CheckpointError(f"{hf_name!r}: Q4_1 blocks for {rows.shape[0]} rows, "
                              f"the parameter has {n}")
      resolve_attr(model, path.rsplit(".", 1)[0]).q4_1 = WeightBlocks(jnp.asarray(records.records))
      attached += 1
    elif path == "embed.embedding" and model.cfg.tie_embeddings and kind == "Q8_0":
      n, k = var.shape
      packed = pack_q8_0(rows, k)
      if packed.q.shape != (n, k):
        raise CheckpointError(f"{hf_name!r}: Q8_0 blocks of shape {packed.q.shape}, "
                              f"the parameter has {(n, k)}")
      model.head_q8_0_q = WeightBlocks(jnp.asarray(packed.q))
      model.head_q8_0_d = WeightBlocks(jnp.asarray(packed.d))
      attached += 1
  return attached
