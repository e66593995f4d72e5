"""vsd_jax on the tiny preset, in-process (one CPU device): data order, simulated tau, the
TTT mask, losses that fall, and one clear error per bad input."""

import dataclasses
import json

import numpy as np
import pytest

from configs.train_presets import get_preset, with_overrides
from vsd_jax.data import BatchReader, DataPosition
from vsd_jax.dataset_builder import DatasetError, open_split, write_dataset
from vsd_jax.simulated_tau import simulated_tau


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
  from vsd_jax.build_dataset import build
  data_dir = tmp_path_factory.mktemp("tiny_data")
  build(with_overrides(get_preset("tiny"), [f"data_dir={data_dir}"]), log=lambda *_: None)
  return str(data_dir)


def tiny_cfg(data_dir, *extra):
  return with_overrides(get_preset("tiny"), [f"data_dir={data_dir}", *extra])


def test_dataset_roundtrip_and_masks(tiny_data):
  train = open_split(tiny_data, "train")
  assert len(train) == 96 and len(open_split(tiny_data, "heldout")) == 16
  ex = train[0]
  n = int(ex["prompt_len"])
  assert ex["tokens"].dtype == np.int32
  assert not ex["loss_mask"][:n].any() and ex["loss_mask"][n:].all()


def test_reader_is_seeded_and_resumes_exactly(tiny_data):
  a = BatchReader(tiny_data, "train", 8, 32, seed=3)
  batches = [a.next_batch()["tokens"] for _ in range(30)]  # crosses epoch boundaries
  b = BatchReader(tiny_data, "train", 8, 32, seed=3)
  for _ in range(17):
    b.next_batch()
  resumed = BatchReader(tiny_data, "train", 8, 32, seed=3,
                        position=DataPosition.from_json(json.loads(json.dumps(
                            b.position.to_json()))))
  for i in range(17, 30):
    np.testing.assert_array_equal(resumed.next_batch()["tokens"], batches[i])
  other = BatchReader(tiny_data, "train", 8, 32, seed=4).next_batch()["tokens"]
  assert not np.array_equal(other, batches[0])
  # every example once per epoch (96 examples, batch 8: 12 batches)
  a = BatchReader(tiny_data, "train", 8, 32, seed=3)
  rows = np.concatenate([a.next_batch()["tokens"] for _ in range(12)])
  assert len({r.tobytes() for r in rows}) == len({open_split(tiny_data, "train")[i]["tokens"][
      :32].tobytes() for i in range(96)})


def test_simulated_tau_replays_chain_rounds():
  # one row: prompt 2 tokens, response at 2..9 (end 10); ranks[p, j] about token p + 2 + j
  ranks = np.full((1, 12, 3), 5)
  mask = np.zeros((1, 12))
  mask[0, 2:10] = 1
  ranks[0, 1, :] = [0, 0, 7]  # round 1 (c=2, p=1): accepts 2 -> c = 5
  ranks[0, 4, :] = [0, 0, 0]  # round 2 (c=5, p=4): accepts 3 -> c = 9 = end - 1: done
  out = simulated_tau(ranks, mask, np.array([10]), depth=3)
  assert out["rounds"] == 2 and out["tau"] == pytest.approx((2 + 3 + 2) / 2)
  assert out["accepted_per_position"] == [1.0, 1.0, 0.5]
  # top-2 tree: rank 1 counts too, so round 1 accepts 3 (c = 6), then 3 rounds accept none
  ranks[0, 1, 2] = 1
  out = simulated_tau(ranks, mask, np.array([10]), depth=3, top_k=2)
  assert out["rounds"] == 4 and out["tau"] == pytest.approx((3 + 4) / 4)
  assert simulated_tau(ranks, mask, np.array([10]), depth=3, top_k=1)["tau"] == 3.5
  # depth 4: round 2 accepts the last 4 response tokens (6..9), so its own token would come
  # after the response and is not counted: 3 + 4 tokens in 2 rounds, not 3 + 5.
  ranks4 = np.concatenate([ranks, np.full((1, 12, 1), 5)], axis=2)
  ranks4[0, 1, 2] = 7
  ranks4[0, 4, 3] = 0
  out = simulated_tau(ranks4, mask, np.array([10]), depth=4)
  assert out["rounds"] == 2 and out["tau"] == (3 + 4) / 2
  assert out["accepted_per_position"] == [1.0, 1.0, 0.5, 0.5]


def test_ttt_visibility():
  from vsd_jax.eagle3_ttt import ttt_visibility
  vis = np.asarray(ttt_visibility(4, 3, 2))  # T=4, K=3 steps, step 2
  assert vis.shape == (4, 12)
  for p in range(4):
    assert vis[p, :4].tolist() == [q <= p for q in range(4)]  # context: step-0 entries
    assert vis[p, 4:8].tolist() == [q == p for q in range(4)]  # own chain, step 1
    assert vis[p, 8:].tolist() == [q == p for q in range(4)]  # own chain, step 2
  assert not np.asarray(ttt_visibility(4, 3, 0))[:, 4:].any()


@pytest.mark.parametrize("preset,extra", [("tiny_medusa", []), ("tiny_standalone", []),
                                          ("tiny", ["dtype=bfloat16"])])
def test_baselines_learn(tiny_data, tmp_path, preset, extra):
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  cfg = with_overrides(get_preset(preset), [f"data_dir={tiny_data}", "steps=12",
                                            "eval_every=0", "ckpt_every=100", *extra])
  tr = Trainer(cfg, make_mesh(1, 1), str(tmp_path), log=lambda *_: None, progress=False)
  out = tr.run()
  tr.close()
  losses = [c["loss"] for c in out["curve"]]
  assert np.mean(losses[-3:]) < losses[0]


def run_cli(argv, capsys):
  from vsd_jax.train import main
  code = main(argv)
  return code, capsys.readouterr().err


def test_bad_inputs_give_clear_errors(tiny_data, tmp_path, capsys):
  base = ["--set", f"data_dir={tiny_data}", "--no-progress"]
  code, err = run_cli(["--config=nope", "--workdir", str(tmp_path / "a")] + base, capsys)
  assert code == 2 and "unknown training preset 'nope'" in err and "tiny" in err
  code, err = run_cli(["--config=tiny", "--mesh=2x1", "--workdir", str(tmp_path / "a")] + base,
                      capsys)
  assert code == 2 and "--mesh=2x1 needs 2 devices but 1 are in use" in err
  code, err = run_cli(["--config=tiny", "--mesh=4", "--workdir", str(tmp_path / "a")] + base,
                      capsys)
  assert code == 2 and "DxM" in err
  for steps in ("0", "-5"):
    code, err = run_cli(["--config=tiny", f"--steps={steps}", "--workdir", str(tmp_path / "a"),
                         "--export", str(tmp_path / "drafter")] + base, capsys)
    assert code == 2 and f"--steps must be positive, got {steps}" in err
    assert not (tmp_path / "drafter").exists()
  code, err = run_cli(["--config=tiny", "--workdir", str(tmp_path / "a"), "--no-progress",
                       "--set", f"data_dir={tmp_path / 'missing'}"], capsys)
  assert code == 2 and "no training dataset" in err and "build_dataset" in err
  with pytest.raises(DatasetError, match="has no examples"):
    write_dataset(tmp_path / "empty", {"train": [], "heldout": [([1], [2])]}, {})
  # a checkpoint of a different drafter shape / kind refuses to resume
  work = str(tmp_path / "ckpt")
  code, _ = run_cli(["--config=tiny", "--workdir", work, "--steps=2", "--set", "eval_every=0",
                     "--set", "ckpt_every=2"] + base, capsys)
  assert code == 0
  code, err = run_cli(["--config=tiny", "--workdir", work, "--set", "draft_vocab_size=40",
                       "--set", "eval_every=0"] + base, capsys)
  assert code == 2 and "different shape" in err and "lm_head" in err
  code, err = run_cli(["--config=tiny_medusa", "--workdir", work, "--set", "eval_every=0"] + base,
                      capsys)
  assert code == 2 and "holds a eagle3 drafter, this run trains a medusa drafter" in err
  code, err = run_cli(["--config=tiny", "--workdir", work, "--set", "tiny_width=48"] + base,
                      capsys)
  assert code == 2 and "generated by target 'tiny:64x32x2'" in err  # data of another target
  code, err = run_cli(["--config=tiny", "--workdir", work, "--set", "data.answer_temperature=1",
                       "--set", "vsd_oracle=target"] + base, capsys)
  assert code == 2 and "holds answers made as 'greedy'" in err and "--overwrite" in err


def test_a_resume_keeps_its_runs_settings_and_never_goes_back(tiny_data, tmp_path, capsys):
  """Resuming with other training settings would continue another run under this one's name
  (and an export's manifest would describe neither); asking for fewer steps than the workdir
  holds would run nothing and export the later drafter. Both are refused, nothing written."""
  base = ["--config=tiny", "--no-progress", "--set", f"data_dir={tiny_data}",
          "--set", "eval_every=0", "--set", "ckpt_every=2"]
  work = str(tmp_path / "run")
  code, err = run_cli(base + ["--workdir", work, "--steps=4"], capsys)
  assert code == 0, err
  for extra, message in ((["--set", "lr=0.05"], "lr: checkpoint 0.003 vs run 0.05"),
                         (["--set", "batch_size=4", "--set", "data_seed=7"],
                          "batch_size: checkpoint 8 vs run 4; data_seed: checkpoint 0 vs run 7")):
    code, err = run_cli(base + ["--workdir", work, "--steps=6"] + extra, capsys)
    assert code == 2 and "trained with other settings" in err and message in err, err
  code, err = run_cli(base + ["--workdir", work, "--steps=2", "--export",
                              str(tmp_path / "drafter")], capsys)
  assert code == 2 and "holds step 4, past the 2 steps asked for" in err, err
  assert not (tmp_path / "drafter").exists()
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("[0-9]*")) == ["2", "4"]
  # the bookkeeping may change, and a run may go on for longer
  code, err = run_cli(base + ["--workdir", work, "--steps=6", "--set", "log_every=1"], capsys)
  assert code == 0, err
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("[0-9]*"))[-1] == "6"


def test_rows_that_hold_no_answer_token_are_refused(tiny_data, tmp_path, capsys):
  """Rows are cut to seq_len: where that cuts off every answer, each batch trains on nothing
  (loss 0) and the run would still end "done" and export; and a seq_len no longer than the
  deepest unroll step, head or evaluation depth leaves those terms without labels."""
  from vsd_jax.data import check_answers_fit
  check_answers_fit(tiny_data, 32)
  with pytest.raises(DatasetError, match=r"within seq_len=3 \(its earliest first answer token "
                     r"is at position \d+\)"):
    check_answers_fit(tiny_data, 3)
  base = ["--no-progress", "--set", f"data_dir={tiny_data}", "--workdir", str(tmp_path / "w")]
  code, err = run_cli(["--config=tiny", "--set", "seq_len=3", "--set", "ttt_steps=1",
                       "--set", "eval_k=1", "--set", "eval_tree=0,0"] + base, capsys)
  assert code == 2 and "no row of split 'train'" in err and "raise seq_len" in err, err
  for argv, message in (
      (["--config=tiny", "--set", "seq_len=4", "--set", "eval_k=2", "--set", "eval_tree=2,2"],
       "seq_len=4 leaves ttt_steps=3 no label"),
      (["--config=tiny_medusa", "--set", "medusa_heads=40"], "leaves medusa_heads=40 no label"),
      (["--config=tiny", "--set", "eval_k=31"], "seq_len=32 leaves eval_k=31 no label"),
      (["--config=tiny", "--objective=vsd", "--set", "vsd_depth=40"],
       "seq_len=32 leaves vsd_depth=40 no oracle tokens")):
    code, err = run_cli(argv + base, capsys)
    assert code == 2 and message in err, err
  assert not (tmp_path / "w" / "checkpoints").exists() or not any(
      (tmp_path / "w" / "checkpoints").glob("[0-9]*"))


def test_unknown_override_and_preset():
  with pytest.raises(ValueError, match="unknown training preset"):
    get_preset("smollm2_eagle4")
  with pytest.raises(ValueError, match="bad override"):
    with_overrides(get_preset("tiny"), ["no_such_field=1"])
  assert dataclasses.replace(get_preset("tiny")).name == "tiny"


def test_offline_features_give_the_online_curve(tiny_data, tmp_path):
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  curves = {}
  for features in ("online", "offline"):
    cfg = tiny_cfg(tiny_data, "steps=5", "eval_every=0", "ckpt_every=100",
                   f"features={features}")
    tr = Trainer(cfg, make_mesh(1, 1), str(tmp_path / features), log=lambda *_: None,
                 progress=False)
    curves[features] = [c["loss"] for c in tr.run()["curve"]]
    tr.close()
  np.testing.assert_allclose(curves["offline"], curves["online"], rtol=0, atol=1e-6)


def test_workdir_and_export_paths_are_checked_before_training(tiny_data, tmp_path, capsys):
  base = ["--config=tiny_medusa", "--steps=1", "--no-progress", "--set",  # medusa: fast compile
          f"data_dir={tiny_data}", "--set", "eval_every=0"]
  file = tmp_path / "some_text_file"
  file.write_text("keep me")
  code, err = run_cli(base + ["--workdir", str(file)], capsys)
  assert code == 2 and f"--workdir {file} is a file, not a folder" in err
  # an export that is, holds or sits in the workdir would replace the run's checkpoints
  work = tmp_path / "run"
  (work / "checkpoints").mkdir(parents=True)
  (work / "metrics.jsonl").write_text("{}\n")
  for out in (work, work / "drafter", tmp_path):
    code, err = run_cli(base + ["--workdir", str(work), "--export", str(out)], capsys)
    assert code == 2 and "overlaps --workdir" in err, err
  # a folder or file that is not an earlier export is someone's data
  notes = tmp_path / "notes"
  (notes / "sub").mkdir(parents=True)
  (notes / "notes.txt").write_text("n")
  (notes / "sub" / "y").write_text("y")
  for out, message in ((notes, "holds notes.txt, sub"), (file, "is not a folder")):
    code, err = run_cli(base + ["--workdir", str(tmp_path / "w"), "--export", str(out)], capsys)
    assert code == 2 and err.startswith("error: --export: ") and message in err, err
  assert (work / "metrics.jsonl").read_text() == "{}\n" and (work / "checkpoints").is_dir()
  assert (notes / "notes.txt").read_text() == "n" and (notes / "sub" / "y").read_text() == "y"
  assert file.read_text() == "keep me" and not (tmp_path / "w").exists()
  # an earlier export is replaced (the second run resumes at step 1 and exports again)
  drafter = tmp_path / "drafter"
  for _ in range(2):
    code, err = run_cli(base + ["--workdir", str(tmp_path / "w"), "--export", str(drafter)],
                        capsys)
    assert code == 0, err
  assert sorted(p.name for p in drafter.iterdir()) == [
      "config.json", "manifest.json", "model.safetensors"]


def test_nonfinite_loss_stops_the_run(tiny_data, tmp_path):
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  cfg = with_overrides(get_preset("tiny_medusa"), [f"data_dir={tiny_data}", "steps=3",
                                                   "eval_every=0", "ckpt_every=100"])
  object.__setattr__(cfg, "ttt_step_decay", float("nan"))  # past the config check: NaN loss
  tr = Trainer(cfg, make_mesh(1, 1), str(tmp_path), log=lambda *_: None, progress=False)
  with pytest.raises(ValueError, match="training diverged at step 1: loss nan"):
    tr.run()
  tr.close()


def test_build_dataset_refuses_bad_data_fields(tmp_path, capsys):
  from vsd_jax.build_dataset import main
  for item, message in (("data.num_prompts=-5", "data.num_prompts must be positive, got -5"),
                        ("data.gen_batch=0", "data.gen_batch must be positive, got 0")):
    code = main(["--config=tiny", "--set", f"data_dir={tmp_path / 'd'}", "--set", item])
    assert code == 2 and message in capsys.readouterr().err
  assert not (tmp_path / "d").exists()


def test_checkpoint_of_another_dataset_or_layout_is_refused(tiny_data, tmp_path, capsys):
  """The draft vocabulary map comes from the data_dir's token counts and is not saved with the
  weights: resume, --eval-only and --init-from on another dataset (or with other fused layers)
  would pair the weights with the wrong map, so they are refused; old checkpoints still load."""
  from vsd_jax.build_dataset import build
  from vsd_jax.checkpointing import check_compatible, CheckpointMismatchError
  other = tmp_path / "other_data"
  build(tiny_cfg(other, "data.prompt_seed=5"), log=lambda *_: None)
  run = str(tmp_path / "a")
  common = ["--config=tiny", "--no-progress", "--set", "eval_every=0"]
  code, err = run_cli(common + ["--workdir", run, "--steps=2", "--set", "ckpt_every=2",
                                "--set", f"data_dir={tiny_data}"], capsys)
  assert code == 0, err
  message = "draft vocabulary map was built from another dataset"
  for argv in (["--workdir", run, "--eval-only"], ["--workdir", run, "--steps=3"],
               ["--workdir", str(tmp_path / "b"), "--init-from", run, "--steps=3"]):
    code, err = run_cli(common + argv + ["--set", f"data_dir={other}",
                                         "--set", "data.prompt_seed=5"], capsys)
    assert code == 2 and message in err, err
  code, err = run_cli(common + ["--workdir", str(tmp_path / "c"), "--init-from", run,
                                "--steps=3", "--set", f"data_dir={tiny_data}",
                                "--set", "fused_layers=-1,0,0"], capsys)
  assert code == 2 and "fused_layers=[-1, 0, 1], this run has fused_layers=[-1, 0, 0]" in err, err
  assert not any((tmp_path / "b" / "checkpoints").glob("[0-9]*"))  # refused before training
  # a checkpoint from before the map was recorded resumes (nothing to check it against)
  meta = {"objective": {"drafter": "eagle3", "fused_layers": [-1, 0, 1],
                        "draft_vocab_map": "ab" * 32}, "param_shapes": {}}
  old = {**meta, "objective": {k: v for k, v in meta["objective"].items()
                               if k != "draft_vocab_map"}}
  check_compatible(old, meta, "old")
  with pytest.raises(CheckpointMismatchError, match=message):
    check_compatible(meta, {**meta, "objective": {**meta["objective"],
                                                  "draft_vocab_map": "cd" * 32}}, "new")


SMALL_DATA = ["data.num_prompts=16", "data.heldout_prompts=4", "data.max_new_tokens=6"]


def test_overwrite_drops_the_offline_feature_cache(tmp_path):
  """A rebuilt dataset never meets the features of the one it replaced (other values, or fewer
  rows: an IndexError mid-step)."""
  import shutil
  from vsd_jax.build_dataset import build
  from vsd_jax.feature_cache import load_or_build
  from vsd_jax.targets import load_target
  cfg = tiny_cfg(tmp_path, *SMALL_DATA)
  build(cfg, log=lambda *_: None)
  target = load_target(cfg)
  assert load_or_build(tmp_path, target, (0, 1), 16, 8, log=lambda *_: None).shape[0] == 16
  [old] = tmp_path.glob("features_*.npy")
  shutil.copy(old, tmp_path / "kept")
  build(tiny_cfg(tmp_path, *SMALL_DATA, "data.num_prompts=24"), overwrite=True,
        log=lambda *_: None)
  assert not list(tmp_path.glob("features_*.npy"))
  shutil.copy(tmp_path / "kept", old)  # a stale cache under the old name is not read either
  assert load_or_build(tmp_path, target, (0, 1), 16, 8, log=lambda *_: None).shape[0] == 24


def test_a_build_leaves_no_temporary_folder(tmp_path, monkeypatch):
  """tfds's metadata lookup for a fresh build made an empty /tmp/tmp*tfds folder and kept it."""
  import tempfile
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))
  write_dataset(tmp_path / "data", {"train": [([1], [2, 3])], "heldout": [([4], [5])]}, {})
  assert len(open_split(tmp_path / "data", "train")) == 1
  assert not list(scratch.iterdir())


def test_an_interrupted_build_is_not_a_dataset(tmp_path, capsys):
  from vsd_jax.build_dataset import build, main
  from vsd_jax.dataset_builder import dataset_metadata
  build(tiny_cfg(tmp_path, *SMALL_DATA), log=lambda *_: None)
  root = tmp_path / "target_responses"
  (root / "1.0.0").rename(root / "incomplete.ab12cd_1.0.0")  # what a killed build leaves
  with pytest.raises(DatasetError, match="was interrupted.*--overwrite"):
    dataset_metadata(tmp_path)
  code, err = run_cli(["--config=tiny", "--workdir", str(tmp_path / "w"), "--no-progress",
                       "--set", f"data_dir={tmp_path}", *sum((["--set", s] for s in SMALL_DATA),
                                                              [])], capsys)
  assert code == 2 and "interrupted" in err and "generated by target None" not in err, err
  sets = sum((["--set", s] for s in [f"data_dir={tmp_path}", *SMALL_DATA]), [])
  assert main(["--config=tiny", *sets, "--overwrite"]) == 0
  assert dataset_metadata(tmp_path)["num_train"] == 16
  assert not list(root.glob("incomplete.*"))


def test_existing_dataset_of_other_settings_is_refused(tmp_path, capsys):
  from vsd_jax.build_dataset import main
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  sets = sum((["--set", s] for s in [f"data_dir={tmp_path}", *SMALL_DATA]), [])
  assert main(["--config=tiny", *sets]) == 0
  capsys.readouterr()
  assert main(["--config=tiny", *sets]) == 0  # the same settings: kept as it is
  assert "already holds this dataset" in capsys.readouterr().out
  for extra, message in ((["tiny_width=48"], "generated by target 'tiny:64x32x2'"),
                         (["data.max_new_tokens=8"], "data.max_new_tokens=6, this preset has "
                                                     "data.max_new_tokens=8"),
                         (["data.answer_temperature=1", "vsd_oracle=target"], "'greedy'")):
    code = main(["--config=tiny", *sets, *sum((["--set", s] for s in extra), [])])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "--overwrite" in err, err
  for extra, field in (("data.prompt_seed=1", "data.prompt_seed=0"),
                       ("data.num_prompts=20", "data.num_prompts=16"),
                       ("data.max_new_tokens=8", "data.max_new_tokens=6")):
    with pytest.raises(DatasetError, match=f"built with {field}, this preset"):
      Trainer(tiny_cfg(tmp_path, *SMALL_DATA, extra), make_mesh(1, 1), str(tmp_path / "w"),
              log=lambda *_: None, progress=False)


def test_build_dataset_refuses_a_file_as_data_dir(tmp_path, capsys):
  from vsd_jax.build_dataset import main
  file = tmp_path / "notes.txt"
  file.write_text("keep me")
  code = main(["--config=tiny", "--set", f"data_dir={file}", *sum((["--set", s] for s in
                                                                   SMALL_DATA), [])])
  assert code == 2 and f"data_dir {file} is a file, not a folder" in capsys.readouterr().err
  assert file.read_text() == "keep me"


def test_target_source_matches_the_loaded_target():
  from vsd_jax.targets import target_source
  from vsd_jax.targets import load_target
  cfg = with_overrides(get_preset("tiny"), ["tiny_width=48"])
  assert target_source(cfg) == load_target(cfg).source
  assert target_source(get_preset("smollm2_eagle3")) == get_preset("smollm2_eagle3").target
