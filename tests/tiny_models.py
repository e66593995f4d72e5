"""Tiny random Llama / Qwen2 / Qwen3 models: a torch reference and the matching Flax decoder."""

from __future__ import annotations

import numpy as np

from models.config import ModelConfig
from models.hf_params import decoder_from_hf_tensors

VOCAB = 97

VARIANTS = {
    "llama_tied": ("llama", dict(tie_word_embeddings=True)),
    "llama_untied_llama3rope": ("llama", dict(
        tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama_linear_rope_bias": ("llama", dict(
        tie_word_embeddings=False, attention_bias=True,
        rope_scaling={"rope_type": "linear", "factor": 2.0})),
    "qwen2_tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen3_untied": ("qwen3", dict(tie_word_embeddings=False, head_dim=24)),
    "qwen3_tied": ("qwen3", dict(tie_word_embeddings=True)),
}


def hf_model(variant: str, seed: int = 0, num_layers: int = 2):
  """A random transformers model (eval mode, fp32) for `variant`."""
  import torch
  from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                            Qwen3Config, Qwen3ForCausalLM)
  family, extra = VARIANTS[variant]
  cls_cfg, cls_model = {"llama": (LlamaConfig, LlamaForCausalLM),
                        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
                        "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[family]
  cfg = cls_cfg(hidden_size=64, num_hidden_layers=num_layers, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=96, vocab_size=VOCAB,
                max_position_embeddings=256, rms_norm_eps=1e-6, **extra)
  cfg.architectures = [cls_model.__name__]
  torch.manual_seed(seed)
  model = cls_model(cfg).eval()
  # Random init leaves norms at 1 and biases at 0; perturb them so the test sees them.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or name.endswith(".bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def flax_from_hf(model, dtype: str = "float32"):
  hf_config = model.config.to_dict()
  cfg = ModelConfig.from_hf_config(hf_config, dtype=dtype)
  tensors = {k: v.detach().numpy() for k, v in model.state_dict().items()}
  return decoder_from_hf_tensors(cfg, tensors)


def random_decoder(seed: int = 0, vocab: int = VOCAB, num_layers: int = 2, hidden: int = 64,
                   dtype: str = "float32", tie_embeddings: bool = False):
  """A random Flax decoder without torch (engine tests), initialised at unit scale.

  The default 0.02 init makes every tiny model predict "repeat the last token", so any two of
  them agree perfectly; unit-scale weights give chaotic, model-specific predictions.
  """
  import flax.nnx as nnx
  import jax
  from models.llama import init_decoder
  cfg = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                    num_layers=num_layers, num_heads=4, num_kv_heads=2, head_dim=hidden // 4,
                    rms_norm_eps=1e-6, dtype=dtype, tie_embeddings=tie_embeddings)
  model = init_decoder(cfg, seed)
  keys = iter(jax.random.split(jax.random.key(seed + 1000), 1000))
  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Param) and var.ndim == 2:
      fan_in = var.shape[1] if path[-1] == "embedding" else var.shape[0]
      scale = 1.0 if path[-1] == "embedding" else fan_in ** -0.5
      var.set_value(scale * jax.random.normal(next(keys), var.shape, var.dtype))
  return model


def perturbed_copy(model, noise: float, seed: int = 1):
  """A drafter that partly agrees with `model`: the same weights plus Gaussian noise."""
  import flax.nnx as nnx
  import jax
  graphdef, state = nnx.split(model)
  keys = iter(jax.random.split(jax.random.key(seed), 10000))
  state = jax.tree_util.tree_map(
      lambda x: x + noise * jnp_std(x) * jax.random.normal(next(keys), x.shape, x.dtype)
      if x.ndim == 2 else x, state)
  return nnx.merge(graphdef, state)


def jnp_std(x):
  return float(np.std(np.asarray(x)))


def random_prompts(rng: np.random.RandomState, batch: int, max_len: int, vocab: int = VOCAB):
  lengths = rng.randint(1, max_len + 1, size=batch).astype(np.int32)
  prompt = np.zeros((batch, max_len), np.int32)
  for b, n in enumerate(lengths):
    prompt[b, :n] = rng.randint(0, vocab, size=n)
  return prompt, lengths
