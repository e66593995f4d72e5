"""The calibrated ASD preset of the benchmark: `calibrate_asd` on prompts disjoint from the eval.

Calibration split: the *last* `count` prompts of each suite, while the eval uses the first
`--num-prompts`; the split is refused if the two overlap. For an eval over whole suites,
`--calibration-source training` takes offline training-style prompts instead. The config is computed once, before
any timed row runs, and frozen into the rows and the JSON with the prompt ids it came from.

Calibration rounds are the rounds strict speculative decoding runs on those prompts: the target
answers greedily (EOS ignored), then, walking that answer, the drafter proposes K tokens from
each round's start, the accepted length a is the number of leading matches, and the next round
starts a + 1 tokens later. One target forward over prompt + answer gives every logits row the
q25 recipe reads: the rows up to a block's first mismatch are conditioned on draft tokens that
equal the greedy path, so they are the greedy path's own rows (later rows are never read).

Shape notation: W padded width, K draft block length, V vocabulary.
"""

from __future__ import annotations

import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from asd_jax.asd_config import ASDConfig
from asd_jax.bench_prompts import LOADERS, BenchPrompt
from asd_jax.calibrate import calibrate_asd
from asd_jax.drafter_api import ChainDrafter
from asd_jax.lm_api import LanguageModelFns
from asd_jax.request_checks import round_up
from asd_jax.sampling import SamplingConfig

WIDTH_BUCKET = 64


CALIBRATION_SOURCES = ("suite-tail", "training")
TRAINING_SEED = 1  # the shipped drafters were distilled on seed-0 prompts


def calibration_prompts(suites: Sequence[str], eval_count: int, count: int,
                        source: str = "suite-tail") -> list[BenchPrompt]:
  """Calibration prompts disjoint from the eval prompts (the first eval_count of each suite).

  suite-tail: the last `count` prompts of each suite (ValueError if they would overlap the
  eval prompts, e.g. when the eval takes a whole suite). training: count * len(suites) offline
  training-style prompts (vsd_jax/training_prompts.py, seed 1), for full-suite evals.
  """
  if source == "training":
    from vsd_jax.training_prompts import build_training_prompts
    texts = build_training_prompts(count * len(suites), seed=TRAINING_SEED)
    return [BenchPrompt("training", f"seed{TRAINING_SEED}-{i}", t) for i, t in enumerate(texts)]
  if source != "suite-tail":
    raise ValueError(f"unknown calibration source {source!r}; choose from "
                     f"{', '.join(CALIBRATION_SOURCES)}")
  out = []
  for suite in suites:
    prompts = LOADERS[suite]()
    if eval_count + count > len(prompts):
      raise ValueError(f"{suite} has {len(prompts)} prompts: {eval_count} eval + {count} "
                       "calibration prompts would overlap (use --calibration-source training)")
    out.extend(prompts[len(prompts) - count:])
  return out


def _bucket(n: int) -> int:
  return round_up(n, WIDTH_BUCKET)


@functools.partial(jax.jit, static_argnums=0)
def _path_logits(fns: LanguageModelFns, params, tokens_1xW):
  """Logits after every token of one right-padded row: float32 [W, V]."""
  w = tokens_1xW.shape[1]
  cache = fns.init_cache(1, w)
  logits_1xWxV, _, _ = fns.forward(params, tokens_1xW, jnp.arange(w, dtype=jnp.int32)[None],
                                   cache)
  return logits_1xWxV[0]


def path_logits(fns: LanguageModelFns, params, ids: Sequence[int]) -> jax.Array:
  """Target logits after each of `ids` (float32 [len(ids), V]); widths padded to 64."""
  tokens = np.zeros((1, _bucket(len(ids))), np.int32)
  tokens[0, :len(ids)] = ids
  return _path_logits(fns, params, tokens)[:len(ids)]


@functools.partial(jax.jit, static_argnums=(0,))
def _propose(drafter: ChainDrafter, params, prefix_1xW, n):
  """The drafter's greedy block after the first n tokens of prefix_1xW: int32 [1, K]."""
  w = prefix_1xW.shape[1]
  state = drafter.prefill(params, prefix_1xW, n[None], w + drafter.num_draft + 2)
  recent_1x2 = jax.lax.dynamic_slice(prefix_1xW, (0, n - 2), (1, 2))
  positions_1x2 = (n + jnp.arange(-2, 0, dtype=jnp.int32))[None]
  draft_1xK, _, _ = drafter.propose(params, state, recent_1x2, positions_1x2,
                                    jax.random.PRNGKey(0), SamplingConfig())
  return draft_1xK


def strict_rounds(target: LanguageModelFns, target_params, drafter: ChainDrafter, drafter_params,
                  prompt: Sequence[int], answer: Sequence[int]):
  """(drafts, logits, accepted): the strict rounds over `answer`, the target's greedy answer.

  drafts: list of int32 [1, K]; logits: list of float32 [1, K+1, V] (rows after the first
  mismatch are the greedy path's, which the q25 recipe never reads); accepted: a per round.
  Rounds stop when fewer than K answer tokens remain after the round's start.
  """
  if len(prompt) < 2:
    raise ValueError("calibration prompts need at least 2 tokens")
  k = drafter.num_draft
  seq = list(prompt) + list(answer)
  z_LxV = path_logits(target, target_params, seq)
  padded = np.zeros((1, _bucket(len(seq) + k)), np.int32)
  padded[0, :len(seq)] = seq
  drafts, logits, accepted = [], [], []
  n = len(prompt)
  while n + k <= len(seq):
    draft_1xK = np.asarray(_propose(drafter, drafter_params, padded, jnp.int32(n)))
    match = draft_1xK[0] == np.asarray(seq[n:n + k])
    a = int(np.cumprod(match).sum())
    drafts.append(draft_1xK)
    logits.append(z_LxV[n - 1:n + k][None])
    accepted.append(a)
    n += a + 1
  return drafts, logits, accepted


def calibrate_on_prompts(target: LanguageModelFns, target_params, drafter: ChainDrafter,
                         drafter_params, prompts: Sequence[Sequence[int]],
                         answers: Sequence[Sequence[int]]) -> tuple[ASDConfig, dict]:
  """calibrate_asd (q25 recipe) over the strict rounds of every prompt; (config, record)."""
  drafts, logits, accepted = [], [], []
  for prompt, answer in zip(prompts, answers):
    d, z, a = strict_rounds(target, target_params, drafter, drafter_params, prompt, answer)
    drafts += d
    logits += z
    accepted += a
  k = drafter.num_draft
  rejections = sum(a < k for a in accepted)
  cfg = calibrate_asd(drafts, logits)
  record = {"budget": cfg.budget, "gate": cfg.gate, "max_exceptions": cfg.max_exceptions,
            "normalize_q": cfg.normalize_q, "rounds": len(accepted),
            "rounds_with_rejection": rejections,
            "strict_tau": (sum(accepted) + len(accepted)) / max(len(accepted), 1)}
  return cfg, record
