"""Orbax checkpoints of a training run: train state, data position and run description.

One `ocp.CheckpointManager` per workdir (`<workdir>/checkpoints/<step>/`): async saves,
keeps the newest N, atomic (orbax writes a temporary folder and renames it when the save is
complete, so a run killed mid-save leaves only whole checkpoints). Items:

  state  StandardSave  TrainState (params, optimiser state, step, RNG), sharded as in training
  data   JsonSave      DataPosition of the batch reader after the saved step
  meta   JsonSave      objective description, parameter shapes, target, preset name, and the
                       training settings that decide the run (trainer.TRAJECTORY_SETTINGS)

Resume, --init-from and --eval-only refuse a checkpoint whose drafter, target, parameter
shapes, fused target layers or draft vocabulary map (a sha256 of d2t, which the data_dir's
token counts decide) differ from the run's; resume and --eval-only also refuse other objective
or training settings (--init-from starts a new run, so it may change them).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


class CheckpointMismatchError(ValueError):
  """A checkpoint made for a different drafter or target shape."""


class CheckpointCorruptError(ValueError):
  """A checkpoint folder that cannot be read back (truncated, corrupted, files missing)."""


def param_shapes(tree) -> dict[str, list[int]]:
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): [int(d) for d in np.shape(x)] for path, x in flat}


class Checkpointer:

  def __init__(self, workdir: str | os.PathLike, keep: int, async_save: bool = True):
    self.directory = Path(workdir).resolve() / "checkpoints"
    self.manager = ocp.CheckpointManager(
        self.directory, item_names=("state", "data", "meta"),
        options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                             enable_async_checkpointing=async_save))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def save(self, step: int, state, data_position: dict, meta: dict, force: bool = False):
    self.manager.save(step, force=force, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_position),
        meta=ocp.args.JsonSave(meta)))

  def restore_params(self, abstract_state, meta: dict):
    """The newest checkpoint's parameters, for a new run that starts from them (--init-from).

    Drafter kind, target and parameter shapes must agree; the objective may differ (e.g. a
    VSD phase on top of a baseline-trained drafter).
    """
    step = self.latest_step()
    if step is None:
      raise ValueError(f"--init-from: no checkpoint in {self.directory}")
    where = self._check_meta(step, meta, same_objective=False)
    with _readable(where):
      state = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state)))["state"]
    return state.params, where

  def restore(self, step: int, abstract_state, meta: dict) -> tuple[Any, dict]:
    """Restores the state onto `abstract_state`'s shardings after checking `meta` agrees.

    Raises CheckpointCorruptError naming the folder when it cannot be read back (orbax only
    finalizes whole checkpoints, so this means damage after the save, not a killed run).
    """
    where = self._check_meta(step, meta)
    with _readable(where):
      out = self.manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
    return out["state"], out["data"]

  def _check_meta(self, step: int, meta: dict, same_objective: bool = True) -> Path:
    """Reads checkpoint `step`'s meta and checks it against `meta`; returns its folder."""
    where = self.directory / str(step)
    with _readable(where):
      saved_meta = self.manager.restore(step, args=ocp.args.Composite(
          meta=ocp.args.JsonRestore()))["meta"]
    if not isinstance(saved_meta, dict):
      raise CheckpointCorruptError(f"checkpoint {where} is corrupt: meta is not a JSON object")
    check_compatible(saved_meta, meta, where, same_objective)
    return where

  def wait(self):
    self.manager.wait_until_finished()

  def close(self):
    self.manager.wait_until_finished()
    self.manager.close()


class _readable:
  """Turns any failure to read checkpoint `where` into one CheckpointCorruptError line."""

  def __init__(self, where: Path):
    self.where = where

  def __enter__(self):
    return self

  def __exit__(self, kind, error, tb):
    if error is None or not isinstance(error, Exception) or isinstance(
        error, CheckpointMismatchError):
      return False
    detail = (str(error).strip().splitlines() or [""])[0][:200]
    raise CheckpointCorruptError(
        f"checkpoint {self.where} is corrupt or truncated ({type(error).__name__}: {detail}); "
        f"delete that folder to resume from an earlier checkpoint") from error


def _objective_flag(objective: dict) -> str:
  """The --objective value that trains this objective (baseline: the drafter kind's own loss,
  e.g. eagle3_ttt)."""
  return "vsd" if objective.get("name") == "vsd" else "baseline"


def check_compatible(saved: dict, current: dict, where, same_objective: bool = True) -> None:
  """Raises CheckpointMismatchError naming the first difference (kind, target, shapes, fused
  layers, draft vocabulary map, rest); a checkpoint without a vocabulary-map field passes that."""
  hint = "; use another --workdir or the matching preset"
  s_obj, c_obj = saved.get("objective", {}), current.get("objective", {})
  if s_obj.get("drafter") != c_obj.get("drafter"):
    raise CheckpointMismatchError(f"checkpoint {where} holds a {s_obj.get('drafter')} drafter, "
                                  f"this run trains a {c_obj.get('drafter')} drafter{hint}")
  if saved.get("target") != current.get("target") or s_obj.get("target") != c_obj.get("target"):
    raise CheckpointMismatchError(
        f"checkpoint {where} was made for target {saved.get('target')!r} "
        f"(vocab, width, layers {s_obj.get('target')}), this run's target is "
        f"{current.get('target')!r} ({c_obj.get('target')}){hint}")
  s, c = saved.get("param_shapes", {}), current.get("param_shapes", {})
  if s != c:
    diff = sorted(k for k in set(s) | set(c) if s.get(k) != c.get(k))[:4]
    detail = "; ".join(f"{k}: checkpoint {s.get(k)} vs run {c.get(k)}" for k in diff)
    raise CheckpointMismatchError(f"checkpoint {where} holds a drafter of different shape "
                                  f"({detail}){hint}")
  # Same shapes, another drafter: refused for --init-from too, where the objective may change.
  if s_obj.get("fused_layers") != c_obj.get("fused_layers"):
    raise CheckpointMismatchError(
        f"checkpoint {where} holds a drafter fed by target layers fused_layers="
        f"{s_obj.get('fused_layers')}, this run has fused_layers={c_obj.get('fused_layers')}"
        f"{hint}")
  if "draft_vocab_map" not in s_obj:  # checkpoints from before the field: nothing to check
    c_obj = {k: v for k, v in c_obj.items() if k != "draft_vocab_map"}
  elif s_obj["draft_vocab_map"] != c_obj.get("draft_vocab_map"):
    raise CheckpointMismatchError(
        f"checkpoint {where}'s draft vocabulary map was built from another dataset (d2t sha256 "
        f"{s_obj['draft_vocab_map'][:12]}, this run's data_dir gives "
        f"{str(c_obj.get('draft_vocab_map'))[:12]}); its weights only fit that map: use the "
        f"data_dir it was trained on, or another --workdir")
  saved_flag, run_flag = _objective_flag(s_obj), _objective_flag(c_obj)
  if same_objective and saved_flag != run_flag:
    # Named as the flag to pass: --eval-only and resume default to --objective=baseline.
    raise CheckpointMismatchError(
        f"checkpoint {where} was trained with --objective={saved_flag}, this run has "
        f"--objective={run_flag}: pass --objective={saved_flag}, or use another --workdir")
  s_run, c_run = saved.get("training"), current.get("training") or {}
  if same_objective and s_run is not None and s_run != c_run:  # older checkpoints: no field
    diff = "; ".join(f"{k}: checkpoint {s_run.get(k)!r} vs run {c_run.get(k)!r}"
                     for k in sorted(set(s_run) | set(c_run)) if s_run.get(k) != c_run.get(k))
    raise CheckpointMismatchError(
        f"checkpoint {where} was trained with other settings ({diff}): resuming would "
        f"continue another run than this one; pass the same --set flags{hint}")
  if same_objective and s_obj != c_obj:
    diff = "; ".join(f"{k}: checkpoint {s_obj.get(k)!r} vs run {c_obj.get(k)!r}"
                     for k in sorted(set(s_obj) | set(c_obj)) if s_obj.get(k) != c_obj.get(k))
    raise CheckpointMismatchError(f"checkpoint {where} was made with other objective settings "
                                  f"({diff}): pass the same --set flags{hint}")
