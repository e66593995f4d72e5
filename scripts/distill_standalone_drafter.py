"""Distils a small standalone drafter (1-2 Llama layers, the target's tokenizer) from a target.

Steps: (1) the target answers offline training prompts (vsd_jax/training_prompts.py) with greedy
`plain_decode`; the token ids are cached in out/ so reruns skip this. (2) The drafter takes the
target's widths, a copy of chosen target layers, its final norm and its (tied) embedding, which
stays frozen so the saved folder can borrow it from the target. (3) AdamW trains it on packed
prompt+response rows with cross-entropy to the target's greedy tokens on response positions
only (the LM head runs on those positions alone). (4) Held-out evaluation: greedy agreement,
simulated chain tau, and the real `asd_decode` tau with K=4. (5) The folder is written in
bfloat16 without the embedding (models/drafter_folder.py), with a manifest.

  .venv/bin/python -m scripts.distill_standalone_drafter   # defaults reproduce the shipped drafter

Shape notation: B rows, T packed row length, M loss positions per batch, D width, V vocab.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import shlex
import sys
import time
from pathlib import Path

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm import tqdm

from asd_jax.cli_common import (check_output_path, check_positive_flags, enable_compilation_cache,
                                right_pad, run_cli, split_list_flag)
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.greedy_verify import first_argmax
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from models.drafter_folder import (DRAFTERS_DIR, load_standalone_drafter,
                                   save_standalone_drafter)
from models.errors import CheckpointError
from models.hf_folder import check_replaceable
from models.kv_cache import KVCache
from models.llama import Decoder, num_parameters
from models.lm_fns import decoder_fns
from models.load import load_decoder
from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer
from vsd_jax.training_prompts import build_training_prompts
from vsd_jax.build_dataset import generate
from vsd_jax.targets import Target

_START = time.perf_counter()


def log(msg: str) -> None:
  print(f"[{time.perf_counter() - _START:7.1f}s] {msg}", flush=True)


# --- (1) data: the target's greedy answers --------------------------------------------------


def generate_responses(lm, tokenizer, prompts, *, max_new_tokens, batch_size, cache_dir):
  """Prompt and response ids per prompt (response includes EOS when hit).

  The answers come from vsd_jax.build_dataset.generate (batched plain decoding, cached as
  out/distill_data_<key>.npz under the same key, so the two share their cache).
  """
  rows = [encode_chat(tokenizer, p) for p in prompts]
  target = Target(lm.model, tokenizer, eos_token_ids(tokenizer, lm.hf_config), lm.source,
                  checkpoint=lm.source)
  responses, stats = generate(target, rows, max_new_tokens, batch_size, cache_dir, log=log)
  return [np.asarray(r, np.int32) for r in rows], responses, stats


def pack_rows(prompts, responses, order, seq_len):
  """First-fit packing of prompt+response sequences (in `order`) into rows of `seq_len` tokens.

  Returns int32 arrays [R, T]: tokens, positions (restart per sequence), segment ids (0 = pad)
  and labels (the next token where it is a response token, else -1).
  """
  rows, free = [], []
  for i in order:
    seq = np.concatenate([prompts[i], responses[i]])[:seq_len]
    r = next((r for r, f in enumerate(free) if f >= len(seq)), len(rows))
    if r == len(rows):
      rows.append([])
      free.append(seq_len)
    rows[r].append((seq, len(prompts[i])))
    free[r] -= len(seq)
  out = {k: np.zeros((len(rows), seq_len), np.int32) for k in ("tokens", "positions", "segments")}
  out["labels"] = np.full((len(rows), seq_len), -1, np.int32)
  for r, row in enumerate(rows):
    at = 0
    for s, (seq, n_prompt) in enumerate(row, start=1):
      n = len(seq)
      out["tokens"][r, at:at + n] = seq
      out["positions"][r, at:at + n] = np.arange(n)
      out["segments"][r, at:at + n] = s
      # Position p predicts token p+1; response tokens start at index n_prompt.
      out["labels"][r, at + n_prompt - 1:at + n - 1] = seq[n_prompt:]
      at += n
  return out


# --- (2) the drafter ------------------------------------------------------------------------


def init_drafter(target: Decoder, init_layers: tuple[int, ...]) -> Decoder:
  """A `len(init_layers)`-layer decoder with the target's widths, layers, final norm, embedding."""
  cfg = dataclasses.replace(target.cfg, num_layers=len(init_layers))
  _, target_state = nnx.split(target)
  drafter = nnx.eval_shape(lambda: Decoder(cfg, nnx.Rngs(0)))
  graphdef, state = nnx.split(drafter)
  flat = dict(nnx.to_flat_state(target_state))
  new = {}
  for path, _ in nnx.to_flat_state(state):
    src = path
    if path[0] == "layers":
      src = ("layers", init_layers[path[1]]) + path[2:]
    # Copies: training donates the drafter's buffers, which must not be the target's.
    new[path] = flat[src] if path[0] == "embed" else jax.tree.map(jnp.copy, flat[src])
  return nnx.merge(graphdef, nnx.from_flat_state(new))


def packed_hidden(model: Decoder, tokens_BxT, positions_BxT, segments_BxT):
  """Last-layer hidden states [B, T, D] of packed rows (attention stays inside a segment)."""
  b, t = tokens_BxT.shape
  slots_BxT = jnp.broadcast_to(jnp.arange(t), (b, t))
  visible_BxTxS = ((segments_BxT[:, :, None] == segments_BxT[:, None, :])
                   & (slots_BxT[:, None, :] <= slots_BxT[:, :, None]))
  _, hidden, _ = model(tokens_BxT, positions_BxT, KVCache.create(model.cfg, b, t),
                       slots_BxT=slots_BxT, visible_BxTxS=visible_BxTxS,
                       hidden_layers=(model.cfg.num_layers - 1,),
                       logits_at_BxR=jnp.zeros((b, 1), jnp.int32))
  return hidden[:, :, 0]


def head_logits(model: Decoder, head_VxD, h_xD):
  """Final norm + tied head; `head_VxD` may be a bfloat16 copy (float32 accumulation)."""
  return _frozen_head(model.final_norm(h_xD).astype(head_VxD.dtype), head_VxD)


@jax.custom_vjp
def _frozen_head(h_MxD, head_VxD):
  return jnp.einsum("md,vd->mv", h_MxD, head_VxD, preferred_element_type=jnp.float32)


def _frozen_head_fwd(h_MxD, head_VxD):
  return _frozen_head(h_MxD, head_VxD), head_VxD


def _frozen_head_bwd(head_VxD, g_MxV):
  # The head is frozen (no weight gradient), and the input gradient runs in the head's dtype:
  # autodiff would multiply the float32 cotangent by a float32 copy of the bf16 head, ~2x slower.
  g = g_MxV.astype(head_VxD.dtype)
  return jnp.einsum("mv,vd->md", g, head_VxD, preferred_element_type=jnp.float32).astype(
      head_VxD.dtype), None


_frozen_head.defvjp(_frozen_head_fwd, _frozen_head_bwd)


# --- (3) training ---------------------------------------------------------------------------


def loss_batches(packed, batch_size, num_loss, rng):
  """Batches of rows plus the flat indices/labels/weights of (at most) `num_loss` positions."""
  n_rows = packed["tokens"].shape[0]
  while True:
    perm = rng.permutation(n_rows)
    for lo in range(0, n_rows - batch_size + 1, batch_size):
      rows = perm[lo:lo + batch_size]
      batch = {k: v[rows] for k, v in packed.items() if k != "labels"}
      labels = packed["labels"][rows].reshape(-1)
      where = np.flatnonzero(labels >= 0)
      if len(where) > num_loss:  # rare: subsample rather than change the compiled shape
        where = np.sort(rng.choice(where, num_loss, replace=False))
      idx = np.zeros(num_loss, np.int32)
      idx[:len(where)] = where
      batch["loss_idx"] = idx
      batch["loss_labels"] = np.where(np.arange(num_loss) < len(where), labels[idx], 0)
      batch["loss_w"] = (np.arange(num_loss) < len(where)).astype(np.float32)
      yield batch


def make_train_step(graphdef, optimizer):
  def loss_fn(trainable, frozen, head_VxD, batch):
    model = nnx.merge(graphdef, trainable, frozen)
    hidden_BxTxD = packed_hidden(model, batch["tokens"], batch["positions"], batch["segments"])
    h_MxD = hidden_BxTxD.reshape(-1, hidden_BxTxD.shape[-1])[batch["loss_idx"]]
    logits_MxV = head_logits(model, head_VxD, h_MxD)
    label_logit = jnp.take_along_axis(logits_MxV, batch["loss_labels"][:, None], axis=1)[:, 0]
    ce_M = jax.nn.logsumexp(logits_MxV, axis=-1) - label_logit
    w_M = batch["loss_w"]
    hit_M = first_argmax(jax.lax.stop_gradient(logits_MxV))[0] == batch["loss_labels"]
    denom = jnp.maximum(w_M.sum(), 1.0)
    return (ce_M * w_M).sum() / denom, {"acc": (hit_M * w_M).sum() / denom, "n": w_M.sum()}

  def train_step(trainable, opt_state, frozen, head_VxD, batch):
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable, frozen, head_VxD,
                                                                  batch)
    updates, opt_state = optimizer.update(grads, opt_state, trainable)
    trainable = optax.apply_updates(trainable, updates)
    return trainable, opt_state, {"loss": loss, "grad_norm": optax.global_norm(grads), **aux}

  return jax.jit(train_step, donate_argnums=(0, 1))


def train(drafter: Decoder, packed, args, evaluate=None):
  """AdamW on the non-embedding parameters; `evaluate(model) -> float` runs every
  args.eval_every steps. Returns (model, [(step, loss, acc)], [(step, evaluate)])."""
  graphdef, trainable, frozen = nnx.split(drafter, nnx.All(nnx.Param, nnx.Not(
      nnx.PathContains("embed"))), ...)
  head_VxD = drafter.embed.embedding[...].astype(jnp.bfloat16 if args.head_bf16 else jnp.float32)
  warmup = min(args.warmup, args.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, args.lr, warmup, max(args.steps, warmup + 1),
                                                end_value=0.1 * args.lr)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(schedule, b2=0.98, weight_decay=args.weight_decay))
  opt_state = optimizer.init(trainable)
  step_fn = make_train_step(graphdef, optimizer)
  rng = np.random.RandomState(args.seed)
  batches = loss_batches(packed, args.batch_size, args.num_loss, rng)
  curve, evals, pending, tokens_done, eval_s = [], [], None, 0, 0.0
  start = time.perf_counter()
  bar = tqdm(range(args.steps), desc="train", mininterval=10)
  for step in bar:
    batch = next(batches)
    trainable, opt_state, metrics = step_fn(trainable, opt_state, frozen, head_VxD, batch)
    if pending is not None:  # read the previous step's metrics while this one runs
      m = {k: float(v) for k, v in pending.items()}
      tokens_done += int(m["n"])
      curve.append((step - 1, m["loss"], m["acc"]))
      if step == 1:
        start = time.perf_counter()  # tokens/s excludes compilation
        tokens_done = 0
      bar.set_postfix(loss=f"{m['loss']:.3f}", acc=f"{m['acc']:.3f}",
                      tok_s=f"{tokens_done / max(time.perf_counter() - start - eval_s, 1e-9):.0f}")
      if (step - 1) % args.log_every == 0:
        log(f"step {step - 1}: loss {m['loss']:.4f} acc {m['acc']:.4f} "
            f"grad_norm {m['grad_norm']:.3f} lr {float(schedule(step - 1)):.2e}")
      if evaluate is not None and args.eval_every > 0 and (step + 1) % args.eval_every == 0:
        # `trainable` holds step + 1 updates; the next call donates it, so it is still valid.
        t = time.perf_counter()
        evals.append((step + 1, evaluate(nnx.merge(graphdef, trainable, frozen))))
        eval_s += time.perf_counter() - t
        log(f"after {step + 1} steps: held-out agreement {evals[-1][1]:.4f}")
    pending = metrics
  if pending is not None:
    m = {k: float(v) for k, v in pending.items()}
    curve.append((args.steps - 1, m["loss"], m["acc"]))
  seconds = time.perf_counter() - start - eval_s
  log(f"trained {args.steps} steps; {tokens_done / max(seconds, 1e-9):.0f} loss tokens/s "
      f"after compilation, excluding held-out evaluation")
  return nnx.merge(graphdef, trainable, frozen), curve, evals


# --- (4) evaluation -------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnums=0)
def _predict(graphdef, state, tokens_BxT, positions_BxT, segments_BxT):
  """Greedy drafter prediction int32[B, T] at every position of packed rows."""
  model = nnx.merge(graphdef, state)
  h_BxTxD = packed_hidden(model, tokens_BxT, positions_BxT, segments_BxT)
  logits = head_logits(model, model.embed.embedding[...], h_BxTxD.reshape(-1, h_BxTxD.shape[-1]))
  return first_argmax(logits)[0].reshape(tokens_BxT.shape)


def heldout_agreement(drafter: Decoder, prompts, responses, seq_len, ks=(1, 2, 3, 4, 5)):
  """Teacher-forced greedy agreement on response tokens and the chain tau it implies per K.

  Returns (agreement, {K: simulated tau}, number of response tokens scored).
  """
  packed = pack_rows(prompts, responses, range(len(prompts)), seq_len)
  graphdef, state = nnx.split(drafter)
  rows = len(packed["tokens"])
  padded = {k: np.concatenate([v, np.zeros((-rows % 8,) + v.shape[1:], v.dtype)])
            for k, v in packed.items()}  # whole batches of 8: one compiled shape
  preds = np.concatenate([np.asarray(_predict(graphdef, state, padded["tokens"][i:i + 8],
                                              padded["positions"][i:i + 8],
                                              padded["segments"][i:i + 8]))
                          for i in range(0, rows, 8)])[:rows]
  hits = (preds == packed["labels"])[packed["labels"] >= 0]
  # Simulated strict chain decoding on each response: the drafter proposes K tokens from the
  # committed prefix; accepted = its leading run of hits; +1 target token per round.
  taus = {}
  for k in ks:
    rounds = committed = 0
    for r in range(rows):
      for s in np.unique(packed["segments"][r][packed["segments"][r] > 0]):
        ok = (preds[r] == packed["labels"][r])[(packed["segments"][r] == s)
                                                & (packed["labels"][r] >= 0)]
        n, c = len(ok), 1  # the first response token comes from the target's prefill
        while c < n:
          a = 0
          while a < k and c + a < n and ok[c + a]:
            a += 1
          rounds, committed, c = rounds + 1, committed + a + 1, c + a + 1
    taus[k] = committed / max(rounds, 1)
  return float(hits.mean()), taus, int(hits.size)


def decode_check(lm, drafter: Decoder, tokenizer, prompts, k, max_new_tokens):
  """Real `asd_decode` (strict, K) vs `plain_decode` on one batch of held-out prompts."""
  eos = eos_token_ids(tokenizer, lm.hf_config)
  prompt, lengths = right_pad([encode_chat(tokenizer, p) for p in prompts])
  tfns, tparams = decoder_fns(lm.model, name="target")
  dfns, dparams = decoder_fns(drafter, name="drafter")
  chain = lm_chain_drafter(dfns, k)
  run_spec = lambda: asd_decode(tfns, tparams, chain, dparams, prompt, lengths,
                                max_new_tokens=max_new_tokens, rule="strict", eos_ids=eos)
  run_plain = lambda: plain_decode(tfns, tparams, prompt, lengths,
                                   max_new_tokens=max_new_tokens, eos_ids=eos)
  timings = {}
  for name, fn in (("spec", run_spec), ("plain", run_plain)):
    jax.block_until_ready(fn())  # compile
    t = time.perf_counter()
    timings[name] = (jax.block_until_ready(fn()), time.perf_counter() - t)
  spec, plain = timings["spec"][0], timings["plain"][0]
  same = np.array_equal(np.asarray(spec.tokens_BxN), np.asarray(plain.tokens_BxN))
  summary = spec.stats.summary()
  return dict(tau=summary["tau"], tau_per_row=summary["tau_per_row"],
              accepted_per_position=summary["accepted_per_position"],
              batch=len(prompts), max_new_tokens=max_new_tokens,
              wall_speedup_batch=timings["plain"][1] / timings["spec"][1],
              strict_equals_plain=bool(same))


def speed_estimate(tau: float, num_layers: int, k: int) -> float:
  """Forward-cost speedup from DESIGN.md's CPU costs (in target decode steps): verifying K+1
  tokens ~ 1.18 + 0.03 (K+1); one drafter step ~ 0.13 (the 49k head) + 0.028 per layer."""
  return tau / (1.18 + 0.03 * (k + 1) + k * (0.13 + 0.028 * num_layers))


# --- main -----------------------------------------------------------------------------------


def build_parser():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--num-prompts", type=int, default=1000, help="training prompts")
  p.add_argument("--heldout-prompts", type=int, default=48)
  p.add_argument("--prompt-seed", type=int, default=0)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--gen-batch", type=int, default=32)
  p.add_argument("--init-layers", default="0,1", help="target layers copied into the drafter, "
                 "one per drafter layer, e.g. '0' or '0,29'")
  p.add_argument("--steps", type=int, default=650)
  p.add_argument("--batch-size", type=int, default=2)
  p.add_argument("--seq-len", type=int, default=512)
  p.add_argument("--num-loss", type=int, default=0,
                 help="loss positions per batch (static); 0: from the data")
  p.add_argument("--lr", type=float, default=5e-3)
  p.add_argument("--warmup", type=int, default=30)
  p.add_argument("--weight-decay", type=float, default=0.0)
  p.add_argument("--head-bf16", type=int, default=1, help="bf16 LM head matmul in training")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--log-every", type=int, default=50)
  p.add_argument("--eval-every", type=int, default=100, help="held-out agreement (0: off)")
  p.add_argument("--k", type=int, default=4)
  p.add_argument("--decode-prompts", type=int, default=8)
  p.add_argument("--decode-max-new", type=int, default=128)
  p.add_argument("--cache-dir", default="out")
  p.add_argument("--out", default=str(DRAFTERS_DIR / "smollm2-135m-standalone"),
                 help="drafter folder to write; '' to skip saving")
  return p


def check_args(args) -> tuple[int, ...]:
  """The target layers to copy, after every flag is checked: the run generates its data and
  trains for about an hour before it writes --out, so a bad flag must fail first."""
  check_positive_flags(args, "num_prompts", "heldout_prompts", "max_new_tokens", "gen_batch",
                       "steps", "batch_size", "seq_len", "k", "decode_prompts",
                       "decode_max_new", "log_every", "lr")
  for name in ("warmup", "eval_every", "weight_decay", "num_loss"):  # 0: off (num_loss: auto)
    if getattr(args, name) < 0:
      raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
  try:
    init_layers = tuple(int(x) for x in split_list_flag(args.init_layers, "--init-layers"))
  except ValueError as e:
    raise ValueError(f"--init-layers must be comma-separated layer numbers ({e})") from None
  if min(init_layers) < 0:
    raise ValueError(f"--init-layers must be layer numbers >= 0, got {args.init_layers!r}")
  if args.out:
    check_output_path(args.out, "--out", folder=True)
    try:
      check_replaceable(args.out)
    except CheckpointError as e:
      raise ValueError(f"--out: {e}") from None
  check_output_path(args.cache_dir, "--cache-dir", folder=True)
  return init_layers


@run_cli
def main(argv=None):
  args = build_parser().parse_args(argv)
  init_layers = check_args(args)
  enable_compilation_cache()
  lm = load_decoder(args.target)
  if max(init_layers) >= lm.cfg.num_layers:
    raise ValueError(f"--init-layers {args.init_layers}: {args.target} has layers 0 to "
                     f"{lm.cfg.num_layers - 1}")
  tokenizer = load_tokenizer(args.target)
  check_tokenizer_fits(tokenizer, lm.cfg.vocab_size, args.target)
  log(f"loaded {args.target}: {lm.cfg.num_layers} layers, vocab {lm.cfg.vocab_size}")

  # Held-out prompts come from another seed (minus exact repeats of training prompts), so the
  # held-out set does not change with --num-prompts.
  prompts = build_training_prompts(args.num_prompts, args.prompt_seed)
  seen = set(prompts)
  prompts += [p for p in build_training_prompts(2 * args.heldout_prompts, args.prompt_seed + 1)
              if p not in seen][:args.heldout_prompts]
  prompt_ids, responses, gen = generate_responses(
      lm, tokenizer, prompts, max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
      cache_dir=args.cache_dir)
  n = args.num_prompts
  train_p, train_r = prompt_ids[:n], responses[:n]
  held_p, held_r = prompt_ids[n:], responses[n:]
  data_tokens = int(sum(map(len, train_p)) + sum(map(len, train_r)))
  resp_tokens = int(sum(map(len, train_r)))
  order = np.random.RandomState(args.seed).permutation(n)
  packed = pack_rows(train_p, train_r, order, args.seq_len)
  if args.num_loss <= 0:  # 90th percentile of loss positions per batch; overflow is subsampled
    per_row = (packed["labels"] >= 0).sum(axis=1)
    sums = per_row[np.random.RandomState(0).randint(0, len(per_row), (1000, args.batch_size))]
    args.num_loss = int(-(-np.percentile(sums.sum(axis=1), 90) // 64) * 64)
  log(f"train data: {n} prompts, {data_tokens} tokens ({resp_tokens} response) in "
      f"{len(packed['tokens'])} rows of {args.seq_len} ({(packed['segments'] > 0).mean():.0%} "
      f"full); {args.num_loss} loss positions per batch; "
      f"{args.steps * args.batch_size / len(packed['tokens']):.1f} epochs")

  drafter = init_drafter(lm.model, init_layers)
  layers = len(init_layers)
  log(f"drafter: {layers} layer(s) from target layers {init_layers}, "
      f"{num_parameters(drafter) - lm.cfg.vocab_size * lm.cfg.hidden_size} parameters "
      "besides the shared embedding")
  agree0, taus0, _ = heldout_agreement(drafter, held_p, held_r, args.seq_len)
  log(f"before training: held-out agreement {agree0:.4f}, simulated tau(K=4) {taus0[4]:.3f}")
  train_start = time.perf_counter()
  drafter, curve, evals = train(
      drafter, packed, args, lambda m: heldout_agreement(m, held_p, held_r, args.seq_len, ())[0])
  train_s = time.perf_counter() - train_start

  if args.out:  # evaluate what is saved: bfloat16 weights, embedding from the target
    tmp = Path(args.cache_dir) / "distill_drafter_tmp"
    save_standalone_drafter(tmp, drafter, {})
    drafter = load_standalone_drafter(tmp, lm, dtype="float32")
  agree, taus, n_eval = heldout_agreement(drafter, held_p, held_r, args.seq_len)
  estimates = {k: speed_estimate(t, layers, k) for k, t in taus.items()}
  best_k = max(estimates, key=estimates.get)
  log(f"held-out ({len(held_p)} prompts, {n_eval} tokens): agreement {agree:.4f}; simulated "
      f"tau by K {', '.join(f'{k}: {t:.3f}' for k, t in taus.items())}; speed estimate by K "
      f"{', '.join(f'{k}: {e:.2f}x' for k, e in estimates.items())}")
  decode_prompts = prompts[n:n + args.decode_prompts]
  dec = decode_check(lm, drafter, tokenizer, decode_prompts, args.k, args.decode_max_new)
  log(f"asd_decode strict K={args.k} on {len(decode_prompts)} held-out prompts: tau "
      f"{dec['tau']:.3f}, per-position acceptance "
      f"{[round(x, 3) for x in dec['accepted_per_position']]}, wall speedup at batch "
      f"{dec['batch']} {dec['wall_speedup_batch']:.2f}x, strict == plain: "
      f"{dec['strict_equals_plain']}")

  points = curve[::max(1, len(curve) // 20)]
  points += curve[-1:] if curve and points[-1] != curve[-1] else []
  command = [".venv/bin/python", "-m", "scripts.distill_standalone_drafter",
             *(sys.argv[1:] if argv is None else argv)]
  manifest = {
      "command": " ".join(shlex.quote(a) for a in command),
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "target": args.target, "init_layers": list(init_layers),
      "data_prompts": n, "data_tokens": data_tokens, "data_response_tokens": resp_tokens,
      "generation_tokens_per_s": round(gen["tokens_per_s"], 1),
      "max_new_tokens": args.max_new_tokens, "prompt_seed": args.prompt_seed,
      "objective": "cross-entropy to the target's greedy tokens (response positions only), "
                   "embedding frozen",
      "steps": args.steps, "batch_size": args.batch_size, "seq_len": args.seq_len,
      "loss_positions_per_batch": args.num_loss, "lr": args.lr,
      "train_seconds": round(train_s, 1),
      "train_curve_step_loss_acc": [[s, round(l, 4), round(a, 4)] for s, l, a in points],
      "heldout_agreement_curve": [[s, round(a, 4)] for s, a in evals],
      "heldout_prompts": len(held_p), "heldout_tokens": n_eval,
      "heldout_agreement_before": round(agree0, 4), "heldout_agreement": round(agree, 4),
      "simulated_tau_by_k": {k: round(t, 4) for k, t in taus.items()},
      "speed_estimate_by_k": {k: round(e, 3) for k, e in estimates.items()},
      "best_k_estimate": best_k,
      f"tau_k{args.k}": round(dec["tau"], 4), "decode_check": dec,
      "wall_seconds": round(time.perf_counter() - _START, 1),
      "versions": {"jax": jax.__version__, "python": sys.version.split()[0]},
  }
  if args.out:
    save_standalone_drafter(args.out, drafter, manifest, extra_config={
        k: lm.hf_config[k] for k in ("bos_token_id", "eos_token_id") if k in lm.hf_config})
    size = sum(p.stat().st_size for p in Path(args.out).iterdir())
    log(f"wrote {args.out} ({size / 2**20:.1f} MiB)")
  print(json.dumps({k: v for k, v in manifest.items() if k != "train_curve_step_loss_acc"}))


if __name__ == "__main__":
  main()
