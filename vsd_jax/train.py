"""Train a drafter: `python -m vsd_jax.train --config=PRESET --mesh=DxM --workdir=DIR`.

  python -m vsd_jax.build_dataset --config=smollm2_eagle3          # once per dataset
  python -m vsd_jax.train --config=smollm2_eagle3 --mesh=1x1 --workdir=out/runs/e3 \
      --export=drafters/smollm2-135m-eagle3

Rerunning the same command resumes from the newest checkpoint in --workdir (parameters,
optimiser state, step, RNG and data position), so a killed or preempted run continues
exactly; SIGTERM saves a checkpoint before exiting. A rerun may ask for more steps or change
the logging and evaluation periods; other training settings, or fewer steps than the workdir
holds, are refused. Prints one JSON summary line at the end.
Multi-host: pass --distributed (calls `jax.distributed.initialize()`, which reads the
coordinator from the cluster environment) on every host with the same flags.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

from configs.train_presets import get_preset, with_overrides


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--config", required=True,
                 help="training preset (configs/train_presets.py), e.g. tiny, smollm2_eagle3")
  p.add_argument("--mesh", default="1x1", help="DxM: data x model mesh over the devices")
  p.add_argument("--num-devices", type=int, default=None,
                 help="use the first N devices (default: all; must equal D*M)")
  p.add_argument("--workdir", required=True, help="checkpoints, metrics.jsonl, summary.json")
  p.add_argument("--objective", default="baseline", choices=("baseline", "vsd"),
                 help="baseline: the drafter's token loss; vsd: specs/vsd.md (EAGLE-3 drafters; "
                      "knobs: --set vsd_paths=16 vsd_arw=off ...)")
  p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                 help="override a preset field (repeatable), e.g. --set steps=200")
  p.add_argument("--steps", type=int, default=None,
                 help="stop after this many total steps (the schedule still uses the preset's)")
  p.add_argument("--export", default="", help="write the trained drafter folder here")
  p.add_argument("--init-from", default="",
                 help="start a new run from the newest checkpoint's parameters in this other "
                      "workdir (same drafter and target; the objective may differ)")
  p.add_argument("--eval-only", action="store_true",
                 help="restore the newest checkpoint in --workdir, run the held-out evaluation "
                      "(loss, simulated tau, tree diagnostics), print it as JSON and exit")
  p.add_argument("--no-progress", action="store_true", help="no progress bar")
  p.add_argument("--sync-checkpoints", action="store_true", help="save checkpoints synchronously")
  p.add_argument("--distributed", action="store_true",
                 help="multi-host: call jax.distributed.initialize() first")
  return p


def log(msg: str) -> None:
  print(f"[{datetime.datetime.now():%H:%M:%S}] {msg}", flush=True)


def main(argv=None) -> int:
  args = build_parser().parse_args(argv)
  start = time.perf_counter()
  try:
    cfg = with_overrides(get_preset(args.config), args.set)
    if args.steps is not None and args.steps <= 0:
      # 0 would "finish" at once and --export an untrained drafter.
      raise ValueError(f"--steps must be positive, got {args.steps}")
    check_paths(args.workdir, args.export)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  import jax
  if args.distributed:
    jax.distributed.initialize()
  from vsd_jax.sharding_rules import make_mesh, parse_mesh
  from vsd_jax.trainer import Trainer
  try:
    mesh = make_mesh(*parse_mesh(args.mesh), args.num_devices)
    trainer = Trainer(cfg, mesh, args.workdir, objective=args.objective, log=log,
                      progress=not args.no_progress,
                      async_checkpoints=not args.sync_checkpoints,
                      init_from=args.init_from or None)
    if args.eval_only:
      result = trainer.evaluate_latest()
      trainer.close()
      if jax.process_index() == 0:
        print(json.dumps(result))
      return 0
    log(f"preset {cfg.name}: {cfg.drafter} drafter, target {trainer.target.source}, mesh "
        f"{dict(mesh.shape)}, batch {cfg.batch_size} x {cfg.seq_len}, {cfg.steps} steps")
    summary = trainer.run(args.steps)
  except ValueError as e:  # bad flags, data or checkpoints: one clear line, no traceback
    print(f"error: {e}", file=sys.stderr)
    return 2
  summary["wall_seconds"] = round(time.perf_counter() - start, 1)
  summary["command"] = " ".join(shlex.quote(a) for a in
                                ["python", "-m", "vsd_jax.train",
                                 *(sys.argv[1:] if argv is None else argv)])
  if args.export and summary["stopped"] == "done" and jax.process_index() == 0:
    try:
      summary["export"] = str(export(trainer, args.export, summary))
    except ValueError as e:  # the path changed during training; the checkpoints are kept
      trainer.close()
      print(f"error: --export: {e}", file=sys.stderr)
      return 2
  trainer.close()
  if jax.process_index() == 0:
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    (Path(args.workdir) / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    short = {k: v for k, v in summary.items() if k != "curve"}
    if summary["curve"]:
      short["loss_first_last"] = [summary["curve"][0]["loss"], summary["curve"][-1]["loss"]]
    print(json.dumps(short))
  return 0


def check_paths(workdir: str, export_path: str) -> None:
  """Refuses, before any work, a --workdir or --export that would fail late or lose data.

  Exporting replaces its folder whole, so it must not be, hold or sit in the workdir (that
  deletes the run's checkpoints), and what is there already must be an earlier export.
  """
  from asd_jax.cli_common import check_output_path
  check_output_path(workdir, "--workdir", folder=True)
  work = Path(workdir)
  if not export_path:
    return
  out = Path(export_path)
  w, e = work.resolve(), out.resolve()
  if w == e or w in e.parents or e in w.parents:
    raise ValueError(f"--export {export_path} overlaps --workdir {workdir}: the export replaces "
                     "its folder whole and would delete the run's checkpoints; pick a path "
                     "outside the workdir")
  from models.hf_folder import check_replaceable
  try:
    check_replaceable(out)
  except ValueError as err:
    raise ValueError(f"--export: {err}") from None
  check_output_path(export_path, "--export", folder=True)


def export(trainer, path: str, summary: dict) -> Path:
  """Saves the trained drafter (bfloat16, the target's embedding/head not stored)."""
  import jax
  from vsd_jax.dataset_builder import dataset_metadata
  params = jax.device_get(trainer.state.params)
  module = trainer.objective.export(params, jax.device_get(trainer.frozen))
  cfg = trainer.cfg
  data = dataset_metadata(trainer.data_dir)
  evals = summary["evals"]
  manifest = {
      "command": summary["command"], "preset": cfg.name, "objective": trainer.objective.name,
      "target": trainer.target.source, "steps": summary["end_step"],
      "batch_size": cfg.batch_size, "seq_len": cfg.seq_len, "lr": cfg.lr,
      "data": {k: data.get(k) for k in ("num_train", "train_tokens", "train_response_tokens",
                                        "num_heldout", "heldout_tokens", "generation")},
      "wall_seconds": summary["wall_seconds"],
      "train_tokens_per_s": summary["train_tokens_per_s"],
      "loss_start_end": ([summary["curve"][0]["loss"], summary["curve"][-1]["loss"]]
                         if summary["curve"] else None),
      "heldout_simulated_tau": {"start": evals[0] if evals else None,
                                "end": evals[-1] if evals else None},
      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }
  if cfg.drafter == "standalone":
    from models.drafter_folder import save_standalone_drafter
    return save_standalone_drafter(path, module, manifest)
  from models.drafter_checkpoint import save_drafter
  return save_drafter(path, module, dtype="bfloat16", share_embedding=True, manifest=manifest)


if __name__ == "__main__":
  sys.exit(main())
