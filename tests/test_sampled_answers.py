"""Training text sampled from the target (DataConfig.answer_temperature > 0) instead of greedy."""

import dataclasses

import numpy as np
import pytest

from configs.train_presets import DataConfig, get_preset, with_overrides
from vsd_jax.build_dataset import generate, make_prompts
from vsd_jax.targets import load_target


@pytest.fixture(scope="module")
def tiny():
  target = load_target(get_preset("tiny"))
  return target, make_prompts(target, 6, seed=3)


def test_sampled_answers_are_seeded_per_prompt_and_differ_from_greedy(tiny):
  target, rows = tiny
  greedy, _ = generate(target, rows, 12, batch_size=4, log=lambda *_: None)
  sampled, _ = generate(target, rows, 12, batch_size=4, temperature=1.0, seed=7,
                        log=lambda *_: None)
  # The same prompts in another batch size (other neighbours, other padding rows): prompt i
  # keeps seed 7 + i, so its answer is unchanged.
  again, _ = generate(target, rows, 12, batch_size=3, temperature=1.0, seed=7,
                      log=lambda *_: None)
  other, _ = generate(target, rows, 12, batch_size=4, temperature=1.0, seed=8,
                      log=lambda *_: None)
  assert all(np.array_equal(a, b) for a, b in zip(sampled, again))
  assert any(not np.array_equal(a, b) for a, b in zip(sampled, greedy))
  assert any(not np.array_equal(a, b) for a, b in zip(sampled, other))
  vocab = target.cfg.vocab_size
  assert all(len(a) and a.min() >= 0 and a.max() < vocab for a in sampled)


def test_bad_temperature_and_oracle_are_refused():
  for bad in (-0.5, float("nan"), float("inf")):
    with pytest.raises(ValueError, match="answer_temperature"):
      DataConfig(answer_temperature=bad)
  sampled = get_preset("smollm2_eagle3_sampled")
  assert not sampled.data.greedy and sampled.vsd_oracle == "target"
  # The data is not the target's greedy choice, so it cannot serve as VSD's oracle.
  with pytest.raises(ValueError, match="vsd_oracle=target"):
    dataclasses.replace(sampled, vsd_oracle="data")
  assert get_preset("smollm2_eagle3").data.greedy


def test_sampled_preset_trains_on_samples_and_holds_out_greedy(tiny, tmp_path):
  """The train split is sampled; the held-out split stays the target's greedy answers, so
  held-out simulated tau and diagnostics still measure acceptance at T = 0."""
  from vsd_jax.build_dataset import build
  from vsd_jax.dataset_builder import open_split
  target, _ = tiny
  data = DataConfig(num_prompts=6, heldout_prompts=3, max_new_tokens=10, gen_batch=4,
                    answer_temperature=1.0, answer_seed=5)
  cfg = dataclasses.replace(get_preset("tiny"), data=data, data_dir=str(tmp_path),
                            vsd_oracle="target")
  meta = build(cfg, log=lambda *_: None)
  assert "sampled" in meta["answers"] and "held-out greedy" in meta["answers"]
  rows = make_prompts(target, 9, data.prompt_seed)
  greedy, _ = generate(target, rows, 10, batch_size=4, log=lambda *_: None)
  sampled, _ = generate(target, rows[:6], 10, batch_size=4, temperature=1.0, seed=5,
                        log=lambda *_: None)

  def answers(split):  # prompt -> answer (the split's order is the builder's shuffle)
    source = open_split(str(tmp_path), split)
    out = {}
    for i in range(len(source)):
      ex = source[i]
      n = int(ex["prompt_len"])
      out[tuple(ex["tokens"][:n].tolist())] = ex["tokens"][n:]
    return out

  train, heldout = answers("train"), answers("heldout")
  assert len(train) == 6 and len(heldout) == 3
  for i, row in enumerate(rows):
    split, expected = (train, sampled[i]) if i < 6 else (heldout, greedy[i])
    assert np.array_equal(split[tuple(row)], expected), i
  assert any(not np.array_equal(train[tuple(r)], g) for r, g in zip(rows, greedy[:6]))


def test_data_fields_can_be_overridden():
  cfg = with_overrides(get_preset("smollm2_eagle3_sampled"),
                       ["data.answer_temperature=0.7", "data.answer_seed=3", "steps=5"])
  assert cfg.data.answer_temperature == 0.7 and cfg.data.answer_seed == 3 and cfg.steps == 5
  assert cfg.data.num_prompts == get_preset("smollm2_eagle3_sampled").data.num_prompts
  with pytest.raises(ValueError, match="answer_temperature"):
    with_overrides(cfg, ["data.answer_temperature=-1"])
  with pytest.raises(ValueError, match="bad override"):
    with_overrides(cfg, ["data.no_such_field=1"])
  with pytest.raises(ValueError, match="bad override"):
    with_overrides(cfg, ["data=1"])
  # Sampling the answers of a preset whose VSD oracle is the data is refused when it is set.
  with pytest.raises(ValueError, match="vsd_oracle=target"):
    with_overrides(get_preset("smollm2_eagle3"), ["data.answer_temperature=1"])
