"""The frozen target of a training preset: a registry model, or a tiny random one for tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from configs.train_presets import TrainConfig
from models.config import ModelConfig
from models.llama import Decoder, init_decoder

TINY_TARGET_SEED = 1234


@dataclasses.dataclass
class Target:
  model: Decoder
  tokenizer: Any  # None for the tiny target (prompts are token ids already)
  eos_ids: tuple[int, ...]
  source: str  # what the dataset records, so a dataset is never reused with another target
  checkpoint: str = ""  # resolved weights path (part of the generation cache key)

  @property
  def cfg(self) -> ModelConfig:
    return self.model.cfg


def tiny_target_config(cfg: TrainConfig) -> ModelConfig:
  return ModelConfig(vocab_size=cfg.tiny_vocab, hidden_size=cfg.tiny_width,
                     intermediate_size=2 * cfg.tiny_width, num_layers=cfg.tiny_layers,
                     num_heads=4, num_kv_heads=2, head_dim=cfg.tiny_width // 4,
                     rms_norm_eps=1e-6, tie_embeddings=True, max_position_embeddings=512)


def target_source(cfg: TrainConfig) -> str:
  """The preset's `Target.source`, without loading the target (to check an existing dataset)."""
  if cfg.target == "tiny":
    m = tiny_target_config(cfg)
    return f"tiny:{m.vocab_size}x{m.hidden_size}x{m.num_layers}"
  return cfg.target


def load_target(cfg: TrainConfig, dtype: str = "float32") -> Target:
  """Loads (or, for "tiny", builds deterministically) the preset's target."""
  if cfg.target == "tiny":
    mcfg = tiny_target_config(cfg).with_dtype(dtype)
    return Target(init_decoder(mcfg, seed=TINY_TARGET_SEED), None, (), target_source(cfg))
  from models.load import load_decoder
  from models.tokenizer import check_tokenizer_fits, eos_token_ids, load_tokenizer
  lm = load_decoder(cfg.target, dtype=dtype)
  tok = load_tokenizer(cfg.target)
  check_tokenizer_fits(tok, lm.cfg.vocab_size, cfg.target)  # prompts would hold foreign ids
  return Target(lm.model, tok, eos_token_ids(tok, lm.hf_config), cfg.target, lm.source)
