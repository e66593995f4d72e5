"""The train state pytree and the optimiser: AdamW, warmup + cosine decay, clipping."""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: optimiser steps taken
  params: Any  # trainable drafter parameters (float32 master copy)
  opt_state: Any
  rng: jax.Array  # uint32 [2] raw key: split once per step for stochastic objectives


def make_schedule(cfg) -> optax.Schedule:
  warmup = min(cfg.warmup_steps, max(cfg.steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
      decay_steps=max(cfg.steps, warmup + 1), end_value=cfg.lr * cfg.end_lr_ratio)


def make_optimizer(cfg) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                     optax.adamw(make_schedule(cfg), b1=cfg.b1, b2=cfg.b2,
                                 weight_decay=cfg.weight_decay))


def init_state(params, optimizer, seed: int) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params),
                    rng=jax.random.key_data(jax.random.key(seed)))
