"""The sharded training loop: one jitted step, non-blocking metrics, evaluation, checkpoints.

    trainer = Trainer(cfg, mesh, workdir)      # target, data, objective, shardings
    result = trainer.run()                     # resumes from workdir/checkpoints if present

The step is `jax.jit` with explicit `NamedSharding`s on a ("data", "model") mesh: batch rows
over "data", the frozen target and the drafter's wide matrices over "model" (one rules table,
vsd_jax/sharding_rules.py). The loop dispatches step s+1 before it reads step s's metrics, so
the host never waits on the device except at evaluations and checkpoints.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tqdm import tqdm

from configs.train_presets import TrainConfig
from vsd_jax.checkpointing import Checkpointer, param_shapes
from vsd_jax.data import (BatchReader, DataPosition, check_answers_fit, fixed_batches,
                           response_token_counts)
from vsd_jax.dataset_builder import check_dataset_fits, dataset_metadata
from vsd_jax.objectives import make_objective
from vsd_jax.sharding_rules import batch_sharding, tree_shardings
from vsd_jax.simulated_tau import simulated_tau
from vsd_jax.vsd_diagnostics import diagnostic_rates
from vsd_jax.targets import load_target
from vsd_jax.train_state import TrainState, init_state, make_optimizer, make_schedule

# The settings (besides the objective's, checked on their own) that decide which parameters a
# run reaches: a resume must keep them, or it continues another run than the one it resumes.
# `steps` may grow (training longer); the bookkeeping periods and evaluation may change.
TRAJECTORY_SETTINGS = ("seed", "data_seed", "batch_size", "seq_len", "features", "dtype", "lr",
                       "warmup_steps", "end_lr_ratio", "weight_decay", "clip_norm", "b1", "b2")


class MetricsWriter:
  """JSONL always; TensorBoard too when `tensorboardX` is installed."""

  def __init__(self, workdir: Path, enabled: bool):
    self.enabled = enabled
    self.path = workdir / "metrics.jsonl"
    self.tb = None
    if enabled:
      try:
        from tensorboardX import SummaryWriter
        self.tb = SummaryWriter(str(workdir / "tensorboard"))
      except ImportError:
        pass

  def write(self, record: dict):
    if not self.enabled:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self.tb is not None:
      for k, v in record.items():
        if isinstance(v, (int, float)) and k != "step":
          self.tb.add_scalar(k, v, record["step"])


class Trainer:

  def __init__(self, cfg: TrainConfig, mesh: Mesh, workdir: str, objective: str = "baseline",
               log: Callable[[str], None] = print, progress: bool = True,
               async_checkpoints: bool = True, init_from: str | None = None):
    self.cfg, self.mesh, self.log, self.progress = cfg, mesh, log, progress
    self.init_from = init_from
    self.workdir = Path(workdir)
    data_axis = mesh.shape["data"]
    if cfg.batch_size % data_axis:
      raise ValueError(f"batch_size={cfg.batch_size} is not divisible by the mesh's data axis "
                       f"({data_axis}); pick a batch size that is a multiple of {data_axis}")
    self.target = load_target(cfg, cfg.dtype)
    limit = self.target.cfg.max_position_embeddings
    if cfg.seq_len > limit:  # refuse before the step tries to allocate for it
      raise ValueError(f"seq_len={cfg.seq_len} exceeds the target's {limit} positions "
                       f"(max_position_embeddings of {self.target.source}); use seq_len <= {limit}")
    self.data_dir = cfg.dataset_dir()
    check_dataset_fits(self.data_dir, dataset_metadata(self.data_dir), cfg, self.target.source)
    check_answers_fit(self.data_dir, cfg.seq_len)
    if cfg.eval_every > 0:
      check_answers_fit(self.data_dir, cfg.seq_len, "heldout")
    counts = response_token_counts(self.data_dir, self.target.cfg.vocab_size)
    self.objective = make_objective(cfg, self.target.model, counts, objective)
    self.optimizer = make_optimizer(cfg)
    self.schedule = make_schedule(cfg)

    obj = self.objective
    abstract = jax.eval_shape(lambda p: init_state(p, self.optimizer, cfg.seed), obj.trainable)
    self.state_shardings = tree_shardings(abstract, mesh)
    self.abstract_state = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract,
        self.state_shardings)
    frozen_shardings = tree_shardings(obj.frozen, mesh)
    self.frozen = jax.device_put(obj.frozen, frozen_shardings)
    rows = batch_sharding(mesh)
    self.batch_shardings = {"tokens": rows, "loss_mask": rows, "length": rows}
    self.eval_shardings = dict(self.batch_shardings)
    self.features = None
    if cfg.features == "offline":
      from vsd_jax.feature_cache import load_or_build
      self.features = load_or_build(self.data_dir, self.target, obj.target_hidden_layers,
                                    cfg.seq_len, cfg.batch_size, log)
      self.batch_shardings["features"] = rows
    self._init = jax.jit(lambda p: init_state(p, self.optimizer, cfg.seed),
                         out_shardings=self.state_shardings)
    replicated = NamedSharding(mesh, PartitionSpec())
    self.train_step = jax.jit(self._step, in_shardings=(
        self.state_shardings, frozen_shardings, self.batch_shardings),
        out_shardings=(self.state_shardings, replicated), donate_argnums=0)
    # Held-out evaluation always runs the target online (no "features" in its batches).
    self.ranks = jax.jit(obj.ranks_fn, in_shardings=(
        self.state_shardings.params, frozen_shardings, self.eval_shardings),
        out_shardings=replicated)
    self.eval_loss = jax.jit(lambda p, f, b: obj.loss_fn(p, f, b, jax.random.key(0)),
                             in_shardings=(self.state_shardings.params, frozen_shardings,
                                           self.eval_shardings), out_shardings=replicated)
    self.diagnostics = None
    if obj.diagnostics_fn is not None:
      self.diagnostics = jax.jit(obj.diagnostics_fn, in_shardings=(
          self.state_shardings.params, frozen_shardings, self.eval_shardings),
          out_shardings=replicated)
    self.meta = {"objective": {**obj.describe, "name": obj.name},
                 "target": self.target.source, "preset": cfg.name,
                 "param_shapes": param_shapes(obj.trainable),
                 "training": {f: getattr(cfg, f) for f in TRAJECTORY_SETTINGS}}
    self.checkpointer = Checkpointer(self.workdir, cfg.keep_checkpoints, async_checkpoints)
    self._stop_signal = None

  # --- the step ------------------------------------------------------------------------------

  def _step(self, state: TrainState, frozen, batch):
    key, sub = jax.random.split(jax.random.wrap_key_data(state.rng))
    (loss, metrics), grads = jax.value_and_grad(self.objective.loss_fn, has_aux=True)(
        state.params, frozen, batch, sub)
    updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {**metrics, "loss": loss, "grad_norm": _global_norm(grads),
               "lr": self.schedule(state.step)}
    return TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                      rng=jax.random.key_data(key)), metrics

  def put_batch(self, batch: dict[str, np.ndarray], train: bool = True) -> dict[str, jax.Array]:
    """Host rows (this process's share) -> global arrays sharded over "data"."""
    shardings = self.batch_shardings if train else self.eval_shardings
    if train and self.features is not None:
      batch = {**batch, "features": np.asarray(self.features[batch["index"]])}
    out = {}
    for k, sharding in shardings.items():
      local = np.asarray(batch[k])
      global_shape = (local.shape[0] * jax.process_count(),) + local.shape[1:]
      out[k] = jax.make_array_from_process_local_data(sharding, local, global_shape)
    return out

  # --- evaluation ----------------------------------------------------------------------------

  def evaluate(self, params) -> dict[str, Any]:
    """Held-out loss and simulated tau (chain K; tree depth/top-k) of the current drafter."""
    cfg = self.cfg
    batches = fixed_batches(self.data_dir, "heldout", cfg.batch_size, cfg.seq_len,
                            cfg.eval_examples)
    ranks, masks, lengths, losses, weights, diag = [], [], [], [], [], {}
    share = slice(jax.process_index() * cfg.batch_size // jax.process_count(),
                  (jax.process_index() + 1) * cfg.batch_size // jax.process_count())
    for b in batches:
      dev = self.put_batch({k: v[share] for k, v in b.items()}, train=False)
      ranks.append(np.asarray(self.ranks(params, self.frozen, dev)))
      loss, _ = self.eval_loss(params, self.frozen, dev)
      losses.append(float(loss))
      if self.diagnostics is not None:
        for k, v in jax.device_get(self.diagnostics(params, self.frozen, dev)).items():
          diag[k] = diag.get(k, 0) + float(v)
      weights.append(float(b["loss_mask"].sum()))
      masks.append(b["loss_mask"])
      lengths.append(b["length"])
    ranks, masks, lengths = (np.concatenate(x) for x in (ranks, masks, lengths))
    depth = min(cfg.eval_k, ranks.shape[-1])
    out = {"loss": float(np.average(losses, weights=weights)),
           "examples": int((lengths > 0).sum()),
           f"chain_k{depth}": simulated_tau(ranks, masks, lengths, depth)}
    d, k = cfg.eval_tree
    if d > 0 and k > 0:
      d = min(d, ranks.shape[-1])
      out[f"tree_d{d}_top{k}"] = simulated_tau(ranks, masks, lengths, d, top_k=k)
    if diag:
      out["diagnostics"] = diagnostic_rates(diag)
    return out

  def evaluate_latest(self) -> dict[str, Any]:
    """`evaluate` on the newest checkpoint in the workdir (which must have one)."""
    step = self.checkpointer.latest_step()
    if step is None:
      raise ValueError(f"no checkpoint to evaluate in {self.checkpointer.directory}")
    state, _ = self.restore_or_init()
    return {"step": int(state.step), "objective": self.objective.name,
            **self.evaluate(state.params)}

  # --- the loop ------------------------------------------------------------------------------

  def restore_or_init(self) -> tuple[TrainState, DataPosition]:
    step = self.checkpointer.latest_step()
    if step is None and self.init_from:
      # A new run from another run's parameters: fresh optimiser, step 0, data from the start.
      if not (Path(self.init_from) / "checkpoints").is_dir():  # don't create it (orbax would)
        raise ValueError(f"--init-from: no checkpoint in {Path(self.init_from).resolve()}")
      source = Checkpointer(self.init_from, self.cfg.keep_checkpoints, async_save=False)
      try:
        params, where = source.restore_params(self.abstract_state, self.meta)
      finally:
        source.close()
      self.log(f"initialised from {where}")
      return self._init(params), DataPosition()
    if step is None:
      return self._init(self.objective.trainable), DataPosition()
    state, data = self.checkpointer.restore(step, self.abstract_state, self.meta)
    self.log(f"resumed from {self.checkpointer.directory / str(step)} (step {step})")
    return state, DataPosition.from_json(data)

  def run(self, steps: int | None = None) -> dict[str, Any]:
    """Trains to `steps` (default cfg.steps) total steps; returns a summary dict."""
    cfg = self.cfg
    total = cfg.steps if steps is None else steps
    state, position = self.restore_or_init()
    start_step = int(state.step)
    if start_step > total:  # the loop would run no step and export the later checkpoint
      raise ValueError(f"{self.checkpointer.directory} holds step {start_step}, past the "
                       f"{total} steps asked for; ask for {start_step} or more, or use another "
                       f"--workdir")
    reader = BatchReader(self.data_dir, "train", cfg.batch_size, cfg.seq_len, cfg.data_seed,
                         position, jax.process_index(), jax.process_count())
    writer = MetricsWriter(self.workdir, jax.process_index() == 0)
    self.workdir.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, self._on_sigterm)
    curve, evals = [], []
    bar = tqdm(total=total, initial=start_step, desc=f"train {cfg.name}", mininterval=2,
               disable=not self.progress or jax.process_index() != 0)
    pending, timer = None, None  # timer: (start after the first step, tokens since then)
    summary = {"start_step": start_step, "stopped": "done"}
    try:
      if start_step == 0 and cfg.eval_every > 0:
        evals.append(self._log_eval(0, state.params, writer))
      for step in range(start_step, total):
        host_batch = reader.next_batch()
        state, metrics = self.train_step(state, self.frozen, self.put_batch(host_batch))
        if pending is not None:
          timer = self._report(pending, curve, writer, bar, timer)
        pending = (step, metrics, int(host_batch["length"].sum()) * jax.process_count())
        done = step + 1
        if cfg.eval_every > 0 and done % cfg.eval_every == 0 and done < total:
          evals.append(self._log_eval(done, state.params, writer))
        if done % cfg.ckpt_every == 0 or done == total or self._stop_signal:
          self.checkpointer.save(done, state, reader.position.to_json(), self.meta,
                                 force=bool(self._stop_signal))
        if self._stop_signal:
          summary["stopped"] = "SIGTERM"
          break
      if pending is not None:
        timer = self._report(pending, curve, writer, bar, timer)
      if summary["stopped"] == "done" and cfg.eval_every > 0 and int(state.step) > start_step:
        evals.append(self._log_eval(int(state.step), state.params, writer))
    finally:
      bar.close()
      self.checkpointer.wait()
      signal.signal(signal.SIGTERM, previous)
    train_s = time.perf_counter() - timer[0] if timer else 0.0
    summary.update(end_step=int(state.step), curve=curve, evals=evals,
                   train_tokens_per_s=(timer[1] / train_s if timer and train_s > 0 else None))
    self.state = state
    return summary

  def _report(self, pending, curve, writer, bar, timer):
    step, metrics, tokens = pending
    m = {k: float(v) for k, v in jax.device_get(metrics).items()}
    now = time.perf_counter()
    if timer is None:  # the first step includes compilation; time from its end
      timer = (now, 0)
    else:
      timer = (timer[0], timer[1] + tokens)
    tok_s = timer[1] / max(now - timer[0], 1e-9) if timer[1] else 0.0
    record = {"step": step + 1, **m, "tokens_per_s": tok_s}
    curve.append({"step": step + 1, "loss": m["loss"]})
    writer.write(record)
    if not (np.isfinite(m["loss"]) and np.isfinite(m["grad_norm"])):
      # The update already applied these gradients: every later step would train on NaNs and
      # the run would end "done" with a NaN drafter.
      raise ValueError(f"training diverged at step {step + 1}: loss {m['loss']}, grad_norm "
                       f"{m['grad_norm']}; checkpoints from step {step + 1} on may hold "
                       "non-finite parameters (lower lr, check the data and loss settings)")
    bar.update(1)
    bar.set_postfix(loss=f"{m['loss']:.4f}", tok_s=f"{tok_s:.0f}")
    if (step + 1) % self.cfg.log_every == 0:
      accs = " ".join(f"{k}={v:.3f}" for k, v in m.items() if k.startswith("acc_"))
      self.log(f"step {step + 1}: loss {m['loss']:.5f} grad_norm {m['grad_norm']:.3f} "
               f"lr {m['lr']:.2e} {accs} tokens/s {tok_s:.0f}")
    return timer

  def _log_eval(self, step: int, params, writer) -> dict:
    t = time.perf_counter()
    ev = self.evaluate(params)
    record = {"step": step, "eval_loss": ev["loss"],
              **{f"eval_{k}_tau": v["tau"] for k, v in ev.items()
                 if isinstance(v, dict) and "tau" in v},
              **{f"eval_{k}": v for k, v in ev.get("diagnostics", {}).items()
                 if k != "positions"}}
    writer.write(record)
    self.log(f"eval @ {step}: " + " ".join(f"{k}={v:.4f}" for k, v in record.items()
                                           if k != "step") + f" ({time.perf_counter() - t:.0f} s)")
    return {"step": step, **ev}

  def _on_sigterm(self, signum, frame):
    del frame
    self._stop_signal = signum
    self.log("SIGTERM: saving a checkpoint after this step")

  def close(self):
    self.checkpointer.close()


def _global_norm(tree) -> jax.Array:
  # Squares summed in float32 whatever the gradients' dtype (optax.global_norm is deprecated
  # and sums in the input dtype, where bf16 squares overflow or lose the small terms).
  return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32)))
                      for x in jax.tree_util.tree_leaves(tree)))
