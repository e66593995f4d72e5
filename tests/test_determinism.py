"""Determinism: the same seed gives the same sampled output, across runs and whatever else
shares the batch (each request draws from its own key, asd_jax.sampling_keys), and the same
training run gives bitwise the same parameters."""

import jax
import numpy as np
import pytest

from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.sampling_keys import row_keys
from asd_jax.spec_decode import asd_decode
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

V = 97
_TARGET = random_decoder(seed=21, vocab=V, num_layers=1, hidden=32)
_TFNS, _TPARAMS = decoder_fns(_TARGET)
_DPARAMS = decoder_fns(perturbed_copy(_TARGET, 0.5, seed=4))[1]
SAMPLING = SamplingConfig(temperature=1.0, top_k=40, top_p=0.95)
SEEDS = np.array([101, 7, 55, 3, 2024], np.int64)


_CHAIN = lm_chain_drafter(_TFNS, 3)
_TREE = lm_tree_drafter(_TFNS, TreeShape(2, 2, 6))
ENGINES = {
    "plain": lambda p, n, seed: plain_decode(_TFNS, _TPARAMS, p, n, max_new_tokens=10,
                                             sampling=SAMPLING, seed=seed, capacity=32),
    "chain": lambda p, n, seed: asd_decode(_TFNS, _TPARAMS, _CHAIN, _DPARAMS, p, n,
                                           max_new_tokens=10, rule="sample",
                                           sampling=SAMPLING, seed=seed, capacity=32),
    "tree": lambda p, n, seed: asd_tree_decode(_TFNS, _TPARAMS, _TREE, _DPARAMS, p, n,
                                               max_new_tokens=10, rule="sample",
                                               sampling=SAMPLING, seed=seed, capacity=48),
}


@pytest.mark.parametrize("engine", ENGINES)
def test_sampled_rows_do_not_depend_on_their_batch(engine):
  run = ENGINES[engine]
  prompt, lengths = random_prompts(np.random.RandomState(3), 5, 8, V)
  together = np.asarray(run(prompt, lengths, SEEDS).tokens_BxN)
  assert np.array_equal(together, np.asarray(run(prompt, lengths, SEEDS).tokens_BxN))
  # A different batch order (and size) with the same per-request seeds.
  order = np.array([4, 2, 0])
  sub = np.asarray(run(prompt[order], lengths[order], SEEDS[order]).tokens_BxN)
  np.testing.assert_array_equal(sub, together[order])
  for b in (1, 3):
    alone = np.asarray(run(prompt[b:b + 1], lengths[b:b + 1], int(SEEDS[b])).tokens_BxN)
    np.testing.assert_array_equal(alone[0], together[b])
  # Sampling really is random: another seed changes some row.
  other = np.asarray(run(prompt, lengths, SEEDS + 1).tokens_BxN)
  assert not np.array_equal(other, together)


def test_scalar_seed_gives_distinct_rows_and_row0_equals_alone():
  prompt = np.tile(np.array([[5, 9, 1, 0]], np.int32), (6, 1))
  lengths = np.full(6, 3, np.int32)
  out = np.asarray(ENGINES["chain"](prompt, lengths, 9).tokens_BxN)
  assert len({tuple(r) for r in out}) > 1  # identical prompts, independent streams
  alone = np.asarray(ENGINES["chain"](prompt[:1], lengths[:1], 9).tokens_BxN)
  np.testing.assert_array_equal(alone[0], out[0])


@pytest.mark.parametrize("seed, error, match", [
    (np.array([1, 2]), ValueError, "one per request"), (-1, ValueError, "2\\*\\*32"),
    (2 ** 32, ValueError, "2\\*\\*32"), (1.5, TypeError, "seed"), ("x", TypeError, "seed")])
def test_bad_seeds(seed, error, match):
  with pytest.raises(error, match=match):
    row_keys(seed, 3)


def test_row_keys_are_per_request():
  a = np.asarray(jax.random.key_data(row_keys(np.array([4, 8, 15]), 3)))
  b = np.asarray(jax.random.key_data(row_keys(np.array([15, 4]), 2)))
  np.testing.assert_array_equal(a[[2, 0]], b)
  np.testing.assert_array_equal(jax.random.key_data(row_keys(4, 3))[0], a[0])


def test_same_seed_same_training_run(tmp_path):
  from configs.train_presets import get_preset, with_overrides
  from vsd_jax.build_dataset import build
  from vsd_jax.sharding_rules import make_mesh
  from vsd_jax.trainer import Trainer
  cfg = with_overrides(get_preset("tiny"), [f"data_dir={tmp_path / 'data'}", "steps=3",
                                            "eval_every=0", "ckpt_every=100"])
  build(cfg, log=lambda *_: None)
  runs = []
  for name in ("a", "b"):
    tr = Trainer(cfg, make_mesh(1, 1), str(tmp_path / name), log=lambda *_: None,
                 progress=False)
    curve = [c["loss"] for c in tr.run()["curve"]]
    runs.append((curve, jax.tree_util.tree_leaves(tr.state)))
    tr.close()
  (curve_a, leaves_a), (curve_b, leaves_b) = runs
  assert curve_a == curve_b
  for x, y in zip(leaves_a, leaves_b, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
