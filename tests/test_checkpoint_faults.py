"""Training checkpoint faults: a save cut short, a damaged checkpoint, a full disk.

Orbax writes each checkpoint to a temporary folder and renames it when complete; a kill during
the async write leaves only that temporary folder, which resume must ignore (the kill -9 test
in test_train_resume covers a real process). A finalized checkpoint damaged afterwards must
fail with one clear error that names its folder, and a failed write (ENOSPC) must surface as an
error while the previous checkpoint stays restorable.
"""

import errno
import shutil

import jax
import numpy as np
import pytest

from configs.train_presets import get_preset, with_overrides
from vsd_jax.checkpointing import CheckpointCorruptError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny run with finalized checkpoints at steps 2 and 4, and its final parameters."""
  from vsd_jax.build_dataset import build
  root = tmp_path_factory.mktemp("ckpt_faults")
  cfg = with_overrides(get_preset("tiny"), [f"data_dir={root / 'data'}", "eval_every=0",
                                            "ckpt_every=2", "keep_checkpoints=3"])
  build(cfg, log=lambda *_: None)
  tr = _trainer(cfg, root / "run")
  tr.run(4)
  leaves = [np.asarray(x) for x in jax.tree_util.tree_leaves(tr.state)]
  tr.close()
  return cfg, root / "run", leaves


def _trainer(cfg, workdir):
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  return Trainer(cfg, make_mesh(1, 1), str(workdir), log=lambda *_: None, progress=False)


def _copy(trained, tmp_path):
  cfg, workdir, leaves = trained
  dst = tmp_path / "run"
  shutil.copytree(workdir, dst)
  return cfg, dst, leaves


def _restore(cfg, workdir):
  tr = _trainer(cfg, workdir)
  try:
    return tr.restore_or_init()
  finally:
    tr.close()


def test_an_unfinished_save_is_ignored_and_the_previous_checkpoint_restores(trained, tmp_path):
  cfg, work, leaves = _copy(trained, tmp_path)
  ckpt = work / "checkpoints"
  # What a kill during the async write of step 6 leaves: orbax's temporary folder, half written.
  tmp = ckpt / "6.orbax-checkpoint-tmp-1700000000000000"
  shutil.copytree(ckpt / "4", tmp)
  for f in (p for p in tmp.rglob("*") if p.is_file()):
    f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 3])
  state, _ = _restore(cfg, work)
  assert int(state.step) == 4
  for x, y in zip(leaves, jax.tree_util.tree_leaves(state), strict=True):
    np.testing.assert_array_equal(x, np.asarray(y))


@pytest.mark.parametrize("damage", ["truncate_state", "delete_state", "garbage_meta"])
def test_a_damaged_checkpoint_is_one_clear_error_naming_it(trained, tmp_path, damage):
  cfg, work, _ = _copy(trained, tmp_path)
  step_dir = work / "checkpoints" / "4"
  if damage == "truncate_state":
    for f in (p for p in (step_dir / "state").rglob("*") if p.is_file()):
      f.write_bytes(f.read_bytes()[:7])
  elif damage == "delete_state":
    shutil.rmtree(step_dir / "state")
  else:
    for f in (p for p in (step_dir / "meta").rglob("*") if p.is_file()):
      f.write_text("{not json")
  with pytest.raises(CheckpointCorruptError) as e:
    _restore(cfg, work)
  message = str(e.value)
  assert str(step_dir) in message and "corrupt" in message and "\n" not in message


def test_disk_full_during_a_save_is_an_error_and_loses_nothing(trained, tmp_path, monkeypatch):
  from orbax.checkpoint import handlers
  cfg, work, leaves = _copy(trained, tmp_path)

  async def disk_full(self, x, directory):
    raise OSError(errno.ENOSPC, "No space left on device")

  monkeypatch.setattr(handlers.JsonCheckpointHandler, "_save_fn", disk_full)
  tr = _trainer(cfg, work)
  with pytest.raises(Exception) as e:  # surfaced, not swallowed
    tr.run(6)
    tr.close()
  assert "No space left" in repr(e.value) or "ENOSPC" in repr(e.value) or (
      e.value.__cause__ is not None and "No space left" in repr(e.value.__cause__)), repr(e.value)
  monkeypatch.undo()
  state, _ = _restore(cfg, work)
  assert int(state.step) == 4
  for x, y in zip(leaves, jax.tree_util.tree_leaves(state), strict=True):
    np.testing.assert_array_equal(x, np.asarray(y))
