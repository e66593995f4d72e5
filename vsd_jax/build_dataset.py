"""Builds a preset's training dataset: offline prompts -> the target's answers -> TFDS.

  python -m vsd_jax.build_dataset --config=smollm2_eagle3 [--overwrite]

Prompts come from vsd_jax/training_prompts.py (templated, disjoint from HumanEval and
MT-Bench); the first `num_prompts` form "train", the next `heldout_prompts` "heldout". The
target answers with its chat template and `asd_jax.plain_decode` (one jitted program, fixed
batch; rows sorted by length so padding stays small): greedy, or for the train split sampled at
the preset's `answer_temperature` with one seed per prompt (so an answer does not depend on its
batch). The tiny preset's target is random, so its prompts are random token ids.

Answers are cached in out/distill_data_<hash>.npz (the same cache, and key, as
scripts/distill_standalone_drafter.py), so rebuilding or switching storage costs no target time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from asd_jax.cli_common import check_output_path
from configs.train_presets import get_preset, with_overrides
from vsd_jax.dataset_builder import (DatasetError, check_dataset_fits, dataset_metadata,
                                     write_dataset)
from vsd_jax.targets import Target, load_target, target_source


def make_prompts(target: Target, num: int, seed: int) -> list[list[int]]:
  if target.tokenizer is None:  # tiny random target: random token prompts
    rng = np.random.RandomState(seed)
    vocab = target.cfg.vocab_size
    return [list(rng.randint(1, vocab, rng.randint(4, 13))) for _ in range(num)]
  from models.tokenizer import encode_chat
  from vsd_jax.training_prompts import build_training_prompts
  return [encode_chat(target.tokenizer, p) for p in build_training_prompts(num, seed)]


def generate(target: Target, rows: list[list[int]], max_new_tokens: int, batch_size: int,
             cache_dir: str = "out", log=print, temperature: float = 0.0,
             seed: int = 0) -> tuple[list[np.ndarray], dict]:
  """The target's answers (EOS included when hit) and generation stats: greedy, or sampled at
  `temperature` > 0 with seed `seed + i` for prompt i."""
  from asd_jax.cli_common import right_pad
  from asd_jax.plain_decode import plain_decode
  from asd_jax.sampling import SamplingConfig
  from models.lm_fns import decoder_fns

  sampling = SamplingConfig(temperature=temperature)
  cache = None
  if target.checkpoint:
    what = [[[int(t) for t in r] for r in rows], max_new_tokens, target.checkpoint]
    if not sampling.greedy:  # greedy keys stay as they were, so old caches keep working
      what.append({"temperature": temperature, "seed": seed})
    key = hashlib.sha256(json.dumps(what).encode()).hexdigest()
    cache = Path(cache_dir) / f"distill_data_{key[:16]}.npz"
    if cache.is_file():
      data = np.load(cache)
      resp = np.split(data["resp_flat"].astype(np.int32), np.cumsum(data["resp_len"])[:-1])
      log(f"reusing the target's answers from {cache}")
      return resp, {"cached": str(cache), "tokens_per_s": float(data["tokens_per_s"]),
                    "generated_tokens": int(data["gen_tokens"])}
  fns, params = decoder_fns(target.model)
  order = np.argsort([len(r) for r in rows], kind="stable")
  responses: list[np.ndarray] = [None] * len(rows)
  generated, start = 0, time.perf_counter()
  bar = tqdm(range(0, len(order), batch_size), desc="target generation", mininterval=5)
  for lo in bar:
    idx = order[lo:lo + batch_size]
    batch = [rows[i] for i in idx]
    batch += [batch[-1]] * (batch_size - len(batch))  # one batch size: one compiled program
    prompt, lengths = right_pad(batch, bucket=32)
    seeds = np.asarray([seed + i for i in idx] + [0] * (batch_size - len(idx)), np.int32)
    out = plain_decode(fns, params, prompt, lengths, max_new_tokens=max_new_tokens,
                       eos_ids=target.eos_ids, sampling=sampling, seed=seeds)
    tokens, counts = np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)
    for j, i in enumerate(idx):
      responses[i] = tokens[j, :counts[j]].astype(np.int32)
      generated += int(counts[j])
    bar.set_postfix(tok_s=f"{generated / (time.perf_counter() - start):.0f}")
  seconds = time.perf_counter() - start
  stats = {"seconds": round(seconds, 1), "tokens_per_s": generated / seconds,
           "generated_tokens": generated}
  if cache is not None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    np.savez(cache, prompt_flat=np.concatenate([np.asarray(r, np.int32) for r in rows]),
             prompt_len=[len(r) for r in rows], resp_flat=np.concatenate(responses),
             resp_len=[len(r) for r in responses], gen_tokens=generated,
             tokens_per_s=generated / seconds)
  return responses, stats


def build(cfg, overwrite: bool = False, log=print) -> dict:
  """Generates and writes the dataset of preset `cfg`; returns its metadata."""
  d = cfg.data
  check_output_path(cfg.dataset_dir(), "data_dir", folder=True)  # before any target time
  if not overwrite:
    try:
      meta = dataset_metadata(cfg.dataset_dir())
    except DatasetError:
      meta = None
    if meta is not None:
      check_dataset_fits(cfg.dataset_dir(), meta, cfg, target_source(cfg))
      log(f"{cfg.dataset_dir()} already holds this dataset (target {meta.get('target')!r}); "
          "pass --overwrite to rebuild it")
      return meta
  target = load_target(cfg)
  rows = make_prompts(target, d.num_prompts + d.heldout_prompts, d.prompt_seed)
  t0 = time.perf_counter()
  if d.greedy:  # one call: keeps the answer cache shared with distill_standalone_drafter
    responses, stats = generate(target, rows, d.max_new_tokens, d.gen_batch, log=log)
  else:
    responses, stats = generate(target, rows[:d.num_prompts], d.max_new_tokens, d.gen_batch,
                                log=log, temperature=d.answer_temperature, seed=d.answer_seed)
    # The held-out split stays greedy: its simulated tau and tree diagnostics measure agreement
    # with the target's greedy continuation, i.e. acceptance at T = 0, whatever the training text.
    heldout_responses, heldout_stats = generate(target, rows[d.num_prompts:], d.max_new_tokens,
                                                d.gen_batch, log=log)
    responses = responses + heldout_responses
    stats["heldout"] = heldout_stats
  pairs = list(zip(rows, responses))
  train, heldout = pairs[:d.num_prompts], pairs[d.num_prompts:]
  meta = {"target": target.source, "num_train": len(train), "num_heldout": len(heldout),
          "train_tokens": int(sum(len(p) + len(r) for p, r in train)),
          "train_response_tokens": int(sum(len(r) for _, r in train)),
          "heldout_tokens": int(sum(len(p) + len(r) for p, r in heldout)),
          "max_new_tokens": d.max_new_tokens, "prompt_seed": d.prompt_seed,
          "answers": d.answers,
          "generation": {k: (round(v, 2) if isinstance(v, float) else v)
                         for k, v in stats.items()}}
  t1 = time.perf_counter()
  path = write_dataset(cfg.dataset_dir(), {"train": train, "heldout": heldout}, meta,
                       overwrite=overwrite)
  meta["write_seconds"] = round(time.perf_counter() - t1, 2)
  log(f"wrote {path}: {meta['num_train']} train examples ({meta['train_tokens']} tokens, "
      f"{meta['train_response_tokens']} response), {meta['num_heldout']} held-out; "
      f"generation {stats.get('tokens_per_s', 0):.1f} tok/s, total {time.perf_counter() - t0:.0f} s")
  return meta


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", required=True, help="training preset name (configs/train_presets.py)")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="override a preset field, e.g. --set data_dir=/tmp/d")
  p.add_argument("--overwrite", action="store_true", help="replace an existing dataset")
  args = p.parse_args(argv)
  try:
    cfg = with_overrides(get_preset(args.config), args.set)
    meta = build(cfg, overwrite=args.overwrite)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(meta))
  return 0


if __name__ == "__main__":
  sys.exit(main())
