"""The VSD objective (specs/vsd.md): hand-built E-step/M-step cases, the draft-path rollout
against a one-path-at-a-time reference, the S = 1 special case, finite gradients, the
training CLI, and a short run that learns."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.train_presets import get_preset, with_overrides
from models.eagle3 import draft_to_target_ids
from models.kv_cache import KVCache
from vsd_jax.data import fixed_batches
from vsd_jax.draft_paths import oracle_tokens, rollout, sample_positions
from vsd_jax.sharding_rules import make_mesh
from vsd_jax.trainer import Trainer
from vsd_jax.vsd_paths import (NOT_DRAFTABLE, UNKNOWN, accepted_length, arw_weights, car_penalty,
                               continued_keep, corrected_paths, expected_accepted_length,
                               path_weights, rejected_tokens, weighted_path_nll)

# ------------------------------------------------------------------ hand-built E/M-step cases


def test_three_matching_tokens_give_utility_3_and_the_oracle_correction():
  oracle = jnp.array([5, 6, 7, 8, 9])
  paths = jnp.array([[5, 6, 7, 1, 2],    # 3 accepted, then rejected
                     [4, 6, 7, 8, 9],    # rejected at once
                     [5, 6, 7, 8, 9]])   # all accepted
  tokens, keep, length = corrected_paths(paths, oracle)
  np.testing.assert_array_equal(length, [3, 0, 5])
  np.testing.assert_array_equal(tokens[0][keep[0]], [5, 6, 7, 8])  # 3 tokens + oracle token
  np.testing.assert_array_equal(tokens[1][keep[1]], [5])
  np.testing.assert_array_equal(tokens[2][keep[2]], [5, 6, 7, 8, 9])
  token, rejected = rejected_tokens(paths, oracle, length)
  np.testing.assert_array_equal(token[:2], [1, 4])
  np.testing.assert_array_equal(rejected, [True, True, False])


def test_sentinels_stop_acceptance_and_are_never_labels():
  paths = jnp.array([[5, 6, 7], [5, 3, 7]])
  unknown = jnp.array([5, UNKNOWN, 7])  # end of data after one token
  tokens, keep, length = corrected_paths(paths, unknown)
  np.testing.assert_array_equal(length, [1, 1])
  np.testing.assert_array_equal(keep, [[True, False, False]] * 2)
  _, rejected = rejected_tokens(paths, unknown, length)
  assert not rejected.any()  # nothing to compare with: not a rejection
  undraftable = jnp.array([5, NOT_DRAFTABLE, 7])
  _, keep, length = corrected_paths(paths, undraftable)
  np.testing.assert_array_equal(keep, [[True, False, False]] * 2)
  assert rejected_tokens(paths, undraftable, length)[1].all()  # the target wants another token


def test_the_continued_path_is_the_oracle_up_to_its_first_sentinel():
  np.testing.assert_array_equal(continued_keep(jnp.array([5, 6, 7, 8])), [True] * 4)
  np.testing.assert_array_equal(continued_keep(jnp.array([[5, 6, UNKNOWN, 8],
                                                          [NOT_DRAFTABLE, 6, 7, 8]])),
                                [[True, True, False, False], [False] * 4])


def test_expected_accepted_length_by_hand():
  logq = jnp.log(jnp.array([[0.5, 0.4, 0.2], [0.5, 0.4, 0.2]]))
  p_same = logq  # the target agrees with the drafter: everything is accepted
  np.testing.assert_allclose(expected_accepted_length(p_same, logq), [3.0, 3.0], rtol=1e-6)
  # alpha = min(1, p / q) = [1, 0.5, 1]: 1 + 0.5 + 0.5
  p = jnp.log(jnp.array([[0.9, 0.2, 0.3]]))
  np.testing.assert_allclose(expected_accepted_length(p, logq[:1]), [2.0], rtol=1e-6)
  # A one-hot target (T = 0) gives the accepted length back.
  paths = jnp.array([[5, 6, 1], [4, 6, 7], [5, 6, 7]])
  oracle = jnp.array([5, 6, 7])
  one_hot = jnp.where(paths == oracle, 0.0, -jnp.inf)
  np.testing.assert_allclose(expected_accepted_length(one_hot, jnp.log(jnp.full((3, 3), 0.3))),
                             accepted_length(paths, oracle))


def test_path_weights_are_a_softmax_over_valid_paths():
  utility = jnp.array([[3, 0, 1, 9]])
  valid = jnp.array([[True, True, True, False]])
  w = path_weights(utility, valid, eta=1.0)
  expected = np.exp([3, 0, 1]) / np.exp([3, 0, 1]).sum()
  np.testing.assert_allclose(w[0, :3], expected, rtol=1e-6)
  assert w[0, 3] == 0
  np.testing.assert_array_equal(path_weights(utility, valid & False), 0.0)


def test_arw_with_zero_confidence_is_the_plain_weights():
  w = path_weights(jnp.array([[3, 0, 1, 2]]), jnp.ones((1, 4), bool))
  np.testing.assert_array_equal(arw_weights(w, jnp.zeros(1), jnp.ones((1, 4), bool)), w)
  full = arw_weights(w, jnp.ones(1), jnp.ones((1, 4), bool))
  np.testing.assert_allclose(full, w - 0.25, atol=1e-7)  # c = 1: baseline = mean weight
  np.testing.assert_allclose(full.sum(), 0.0, atol=1e-6)


def test_car_is_zero_unless_a_rejected_token_is_above_gamma():
  q = jnp.array([0.4, 0.9, 0.7])
  assert car_penalty(q, jnp.array([True, False, False]), gamma=0.5) == 0  # 0.4 <= gamma
  assert car_penalty(q, jnp.array([False, False, False]), gamma=0.5) == 0
  got = car_penalty(q, jnp.array([True, True, True]), gamma=0.5)
  np.testing.assert_allclose(got, 0.9 * -np.log(0.1) + 0.7 * -np.log(0.3), rtol=1e-5)
  grad = jax.grad(lambda q: car_penalty(q, jnp.array([True, True, True]), 0.5))(q)
  assert grad[0] == 0 and grad[1] > 0 and np.isfinite(grad).all()


def test_weighted_path_nll_sums_kept_tokens():
  logq = jnp.log(jnp.array([[[0.5, 0.25, 0.1], [0.2, 0.9, 0.9]]]))
  keep = jnp.array([[[True, True, False], [True, False, False]]])
  w = jnp.array([[0.75, 0.25]])
  expected = -(0.75 * np.log(0.5 * 0.25) + 0.25 * np.log(0.2))
  np.testing.assert_allclose(weighted_path_nll(logq, keep, w), [expected], rtol=1e-6)


# ----------------------------------------------------------------- with a tiny EAGLE-3 drafter


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  from vsd_jax.build_dataset import build
  data_dir = tmp_path_factory.mktemp("vsd_data")
  cfg = with_overrides(get_preset("tiny"), [f"data_dir={data_dir}", "ttt_steps=4",
                                            "vsd_depth=4", "vsd_paths=4", "vsd_top_k=3",
                                            "vsd_positions=3", "eval_every=0"])
  build(cfg, log=lambda *_: None)
  trainer = Trainer(cfg, make_mesh(1, 1, 1), str(tmp_path_factory.mktemp("vsd_work")),
                    objective="vsd", log=lambda *_: None, progress=False)
  # Train briefly so the drafter is not uniform (ties would make the tree order arbitrary).
  trainer.run(12)
  batch = trainer.put_batch(fixed_batches(cfg.dataset_dir(), "heldout", cfg.batch_size,
                                          cfg.seq_len, cfg.batch_size)[0], train=False)
  yield trainer, batch
  trainer.close()


def _objective(trainer, cfg):
  """The VSD objective for settings `cfg`, on the fixture's target and data."""
  from vsd_jax.data import response_token_counts
  from vsd_jax.vsd_objective import make_vsd_objective
  return make_vsd_objective(cfg, trainer.target.model, response_token_counts(
      trainer.data_dir, trainer.target.cfg.vocab_size))


def _loss(obj, trainer, batch, seed):
  """(loss, metrics) at the fixture's parameters, compiled as one program: run op by op, the
  objective compiled ~1,200 one-op programs."""
  return jax.jit(obj.loss_fn)(trainer.state.params, trainer.frozen, batch, jax.random.key(seed))


def _loss_and_grads(obj, trainer, batch, seed):
  """((loss, metrics), gradients) at the fixture's parameters, compiled as one program."""
  return jax.jit(jax.value_and_grad(obj.loss_fn, has_aux=True))(
      trainer.state.params, trainer.frozen, batch, jax.random.key(seed))


def _forward_and_paths(trainer, batch, proposal, num_paths, depth, key):
  """The E-step's pieces outside the loss: TTT forward, positions, rollout, oracle."""
  from vsd_jax.eagle3_ttt import eagle3_training
  cfg = trainer.cfg
  e3 = eagle3_training(cfg, trainer.target.model, np.ones(trainer.target.cfg.vocab_size))
  params = trainer.state.params
  frozen = trainer.frozen  # the trainer's vocabulary map; e3 only supplies the functions
  t = batch["tokens"].shape[1]
  extra = (depth - 1) * cfg.vsd_positions * num_paths
  logits, hidden0, cache, _, model = e3.forward(params, frozen, batch, extra_slots=extra)
  rows, ok = sample_positions(jax.random.key(key), batch["loss_mask"], cfg.vsd_positions)
  paths = rollout(model, cache, context_len=t, first_free_slot=cfg.ttt_steps * t,
                  logits0_BxTxVd=logits[0], hidden0_BxTxD=hidden0, rows_BxP=rows,
                  num_paths=num_paths, depth=depth, proposal=proposal, top_k=cfg.vsd_top_k,
                  key=jax.random.key(key + 1))
  oracle = oracle_tokens(batch["tokens"], batch["loss_mask"], frozen["t2d_index"], rows, depth)
  return logits, model, rows, ok, paths, oracle


def test_tree_paths_match_drafting_one_path_at_a_time(tiny):
  trainer, batch = tiny
  logits, model, rows, ok, paths, _ = _forward_and_paths(trainer, batch, "tree", 4, 4, 0)
  got = np.asarray(paths.log_prob(paths.tokens))
  assert bool(ok.any()) and bool(paths.valid.all())
  tokens = np.asarray(batch["tokens"])
  t = tokens.shape[1]
  from vsd_jax.objective_api import target_hidden
  import flax.nnx as nnx
  tgraph, _ = nnx.split(trainer.target.model)
  hidden = target_hidden(tgraph, trainer.frozen["target"], batch,
                         trainer.objective.target_hidden_layers)[:, :, :3]
  # The reference calls the drafter one step at a time, each call compiled once per shape
  # (run eagerly, the test took 33 s here instead of 27). Every path of three sampled
  # positions (two rows, two positions of one) is checked; the tree property below covers all.
  drafter_call = nnx.jit(lambda m, *args: m(*args))
  sampled = [(b, k) for b in range(tokens.shape[0]) for k in range(rows.shape[1]) if ok[b, k]]
  picked = [next(bk for bk in sampled if bk[0] == b) for b in sorted({b for b, _ in sampled})][:2]
  picked += [bk for bk in sampled if bk not in picked][:1]
  checked = 0
  for b, k in picked:
    p = int(rows[b, k])
    for s in range(paths.tokens.shape[2]):
      z = np.asarray(paths.tokens[b, k, s])
      # Reference: a fresh cache, the context rows 0..p, then the path token by token.
      cache = KVCache.create(model.cfg.layer_config(), 1, t + len(z))
      pos = jnp.arange(p + 1)[None]
      lg, h, cache = drafter_call(model, jnp.asarray(tokens[b:b + 1, 1:p + 2]),
                                  hidden[b:b + 1, :p + 1], pos, cache)
      ref = [jax.nn.log_softmax(lg[0, p])[z[0]]]
      h_prev = h[:, p:p + 1]
      target_ids = draft_to_target_ids(model.d2t[...], z)  # the drafter embeds target ids
      for i in range(1, len(z)):
        lg, h_prev, cache = drafter_call(model, jnp.asarray([[target_ids[i - 1]]]), h_prev,
                                         jnp.asarray([[p + i]]), cache)
        ref.append(jax.nn.log_softmax(lg[0, 0])[z[i]])
      np.testing.assert_allclose(got[b, k, s], np.array(ref), atol=2e-4)
      checked += 1
  assert checked >= 4
  # Tree property: the kept paths are distinct and ordered by cumulative log-probability.
  cum = got.sum(-1)
  assert (np.diff(cum, axis=-1) <= 1e-5).all()
  for b in range(tokens.shape[0]):
    for k in range(rows.shape[1]):
      assert len({tuple(z) for z in np.asarray(paths.tokens[b, k])}) == paths.tokens.shape[2]


def _ttt_oracle_nll(logits, batch, rows, ok, t2d, depth):
  """-sum_j log q(o_j) over the oracle's first `depth` tokens (an int, or one per position
  [B, P]) before its first sentinel, under the TTT unroll's teacher-forced states (step j at
  row p predicts the token at p + 2 + j)."""
  tokens, mask = np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"])
  logq = np.asarray(jax.nn.log_softmax(logits, -1))  # [K, B, T, Vd]
  depth_BxP = np.broadcast_to(depth, rows.shape)
  out = np.zeros(rows.shape)
  for b, k in zip(*np.nonzero(np.asarray(ok))):
    p = int(rows[b, k])
    for j in range(int(depth_BxP[b, k])):
      at = p + 2 + j
      if at >= tokens.shape[1] or mask[b, at] == 0 or t2d[tokens[b, at]] < 0:
        break
      out[b, k] -= logq[j, b, p, t2d[tokens[b, at]]]
  return out


def test_s1_without_arw_and_car_is_the_truncated_hard_ttt_loss(tiny):
  """S = 1, ARW and CAR off (the documented special case): L_WL at a position is the hard NLL
  of the first l + 1 data tokens under the TTT unroll's teacher-forced states."""
  trainer, batch = tiny
  logits, model, rows, ok, paths, oracle = _forward_and_paths(trainer, batch, "iid", 1, 4, 3)
  tokens_c, keep, length = corrected_paths(paths.tokens, oracle)
  wl = weighted_path_nll(paths.log_prob(tokens_c), keep, path_weights(length, paths.valid))
  ok = np.asarray(ok)
  expected = _ttt_oracle_nll(logits, batch, rows, ok, np.asarray(trainer.frozen["t2d_index"]),
                             depth=np.minimum(np.asarray(length)[..., 0] + 1, 4))
  assert ok.sum() >= 4
  np.testing.assert_allclose(np.asarray(wl)[ok], expected[ok], rtol=2e-4, atol=2e-4)


def test_continued_paths_are_the_oracle_chain_under_every_weight(tiny):
  """vsd_continue: every corrected path is the oracle's whole chain, scored along the drafter's
  own states on it (the forced rollout equals the TTT unroll's teacher-forced states), so
  L_WL = (sum_s w~_s) * that chain's hard NLL: 1 without ARW, 1 - c with it."""
  from vsd_jax.vsd_objective import vsd_terms
  trainer, batch = tiny
  cfg = trainer.cfg
  logits, model, rows, ok, paths, oracle = _forward_and_paths(trainer, batch, "tree", 4, 4, 9)
  from vsd_jax.eagle3_ttt import eagle3_training
  e3 = eagle3_training(cfg, trainer.target.model, np.ones(trainer.target.cfg.vocab_size))
  t = batch["tokens"].shape[1]
  _, hidden0, cache, _, model = e3.forward(trainer.state.params, trainer.frozen, batch,
                                           extra_slots=3 * cfg.vsd_positions)
  chain = rollout(model, cache, context_len=t, first_free_slot=cfg.ttt_steps * t,
                  logits0_BxTxVd=logits[0], hidden0_BxTxD=hidden0, rows_BxP=rows, num_paths=1,
                  depth=4, proposal="forced", top_k=1, key=jax.random.key(0),
                  forced_BxPxd=oracle)
  safe = np.maximum(np.asarray(oracle), 0)
  np.testing.assert_array_equal(np.asarray(chain.tokens)[:, :, 0], safe)
  expected = _ttt_oracle_nll(logits, batch, rows, ok,
                             np.asarray(trainer.frozen["t2d_index"]), depth=4)
  assert (expected[np.asarray(ok)] > 0).sum() >= 4
  plain = dataclasses.replace(cfg, vsd_continue=True, vsd_arw=False)
  terms = vsd_terms(paths, oracle, ok, plain, chain)
  np.testing.assert_allclose(np.where(ok, terms["wl"], 0), expected, rtol=2e-4, atol=2e-4)
  # Without the continuation the paths stop after their correction: a smaller sum.
  stopped = vsd_terms(paths, oracle, ok, dataclasses.replace(plain, vsd_continue=False))
  assert (np.asarray(stopped["wl"]) <= expected + 2e-4)[np.asarray(ok)].all()
  assert (np.asarray(stopped["wl"]) < expected - 1e-3)[np.asarray(ok)].any()
  arw = vsd_terms(paths, oracle, ok, dataclasses.replace(plain, vsd_arw=True), chain)
  np.testing.assert_allclose(np.where(ok, arw["wl"], 0),
                             (1 - np.asarray(arw["confidence"])) * expected, rtol=2e-4, atol=2e-4)


def test_vsd_continue_trains_and_needs_the_data_oracle(tiny):
  trainer, batch = tiny
  obj = _objective(trainer, dataclasses.replace(trainer.cfg, vsd_continue=True))
  (loss, m), g = _loss_and_grads(obj, trainer, batch, 3)
  _, m_stop = _loss(trainer.objective, trainer, batch, 3)
  assert np.isfinite(float(loss)) and obj.describe["vsd_continue"] is True
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(g))
  assert float(m["loss_wl"]) > float(m_stop["loss_wl"])  # the continuation adds labels
  np.testing.assert_allclose(float(m["loss_div"]), float(m_stop["loss_div"]), rtol=1e-6)
  with pytest.raises(ValueError, match="vsd_continue needs the target's greedy continuation"):
    dataclasses.replace(trainer.cfg, vsd_continue=True, vsd_oracle="target")


def test_vsd_loss_gradients_are_finite_and_reach_every_parameter(tiny):
  trainer, batch = tiny
  obj = trainer.objective
  (loss, metrics), grads = _loss_and_grads(obj, trainer, batch, 7)
  assert np.isfinite(float(loss))
  for name in ("loss_div", "loss_wl", "loss_car", "vsd_utility", "vsd_confidence"):
    assert np.isfinite(float(metrics[name])), name
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
  assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) == len(leaves)
  # WL adds a real gradient on top of the divergence term.
  wl_only = _objective(trainer, dataclasses.replace(trainer.cfg, vsd_lambda_div=0.0,
                                                     vsd_car=False))
  _, g = _loss_and_grads(wl_only, trainer, batch, 7)
  assert float(sum(jnp.abs(x).sum() for x in jax.tree_util.tree_leaves(g))) > 0


def test_diagnostics_are_rates(tiny):
  trainer, _ = tiny
  ev = trainer.evaluate(trainer.state.params)
  d = ev["diagnostics"]
  assert d["positions"] > 0
  assert 0 <= d["greedy_pruned_rate"] <= 1 and 0 <= d["accepted_is_greedy_rate"] <= 1
  assert d["tree_tau"] >= d["greedy_tau"] - 1e-9 or d["greedy_pruned_rate"] > 0
  assert d["tree_tau"] >= 1 and d["greedy_tau"] >= 1


def test_cli_objective_choices_and_drafter_check(tmp_path, capsys):
  from vsd_jax.train import main
  with pytest.raises(SystemExit):
    main(["--config=tiny", f"--workdir={tmp_path}", "--objective=nope"])
  assert "invalid choice: 'nope'" in capsys.readouterr().err
  rc = main(["--config=tiny", f"--workdir={tmp_path}", "--objective=vsd", "--set",
             "vsd_proposal=beam"])
  assert rc == 2 and "vsd_proposal must be tree or iid" in capsys.readouterr().err
  rc = main(["--config=tiny", f"--workdir={tmp_path}", "--set", "vsd_arw=maybe"])
  assert rc == 2 and "vsd_arw" in capsys.readouterr().err


def test_vsd_refuses_non_eagle3_drafters():
  from vsd_jax.vsd_objective import make_vsd_objective
  cfg = get_preset("tiny_medusa")
  with pytest.raises(ValueError, match="trains EAGLE-3 drafters"):
    make_vsd_objective(cfg, None, np.ones(64))


def test_eval_only_restores_and_reports_diagnostics(tiny, capsys):
  import json
  from vsd_jax.train import main
  trainer, _ = tiny
  trainer.checkpointer.wait()
  overrides = [f"{f.name}={getattr(trainer.cfg, f.name)}" for f in dataclasses.fields(
      trainer.cfg) if f.name.startswith("vsd_") or f.name in ("data_dir", "ttt_steps")]
  argv = ["--config=tiny", f"--workdir={trainer.workdir}", "--objective=vsd", "--eval-only"]
  for o in overrides:
    argv += ["--set", o.replace("True", "on").replace("False", "off")]
  assert main(argv) == 0
  out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert out["step"] == 12 and out["objective"] == "vsd"
  assert set(out["diagnostics"]) >= {"greedy_pruned_rate", "accepted_is_greedy_rate"}
  # the flag or setting that differs is named, as the one to pass (it used to print two dicts)
  assert main([a for a in argv if a != "--objective=vsd"]) == 2
  assert "was trained with --objective=vsd, this run has --objective=baseline: pass " \
         "--objective=vsd" in capsys.readouterr().err
  assert main([*argv, "--set", "vsd_eta=2.5"]) == 2
  err = capsys.readouterr().err
  assert "other objective settings" in err and "2.5" in err and "pass the same --set" in err
  empty = trainer.workdir.parent / "empty-workdir"
  assert main(["--config=tiny", f"--workdir={empty}", "--eval-only", "--set",
               f"data_dir={trainer.cfg.data_dir}"]) == 2
  assert "no checkpoint to evaluate" in capsys.readouterr().err


def test_target_oracle_equals_the_data_on_target_greedy_data(tiny):
  """The tiny dataset is the tiny target's greedy text, so asking the target about every path
  prefix must give the data oracle back wherever the path still follows the data."""
  from vsd_jax.target_oracle import target_oracle
  trainer, batch = tiny
  _, model, rows, ok, paths, data_oracle = _forward_and_paths(trainer, batch, "tree", 4, 4, 5)
  oracle = target_oracle(trainer.target.model, batch["tokens"], rows, paths.tokens,
                         model.d2t[...], trainer.frozen["t2d_index"])
  assert oracle.shape == paths.tokens.shape
  data = np.broadcast_to(np.asarray(data_oracle)[:, :, None], oracle.shape)
  length = np.asarray(accepted_length(paths.tokens, data_oracle))
  checked = 0
  for b, k, s in zip(*np.nonzero(np.asarray(ok)[:, :, None] & np.ones(oracle.shape[:3], bool))):
    for j in range(min(int(length[b, k, s]) + 1, oracle.shape[-1])):  # on the data path
      if data[b, k, s, j] == -1:  # past the data: nothing to compare
        break
      assert oracle[b, k, s, j] == data[b, k, s, j], (b, k, s, j)
      checked += 1
  assert checked > 10
  # Past the data's end the target keeps answering, so paths can only be accepted further.
  assert (np.asarray(accepted_length(paths.tokens, oracle)) >= length)[np.asarray(ok)].all()


def test_target_verdicts_give_the_targets_probabilities_along_the_data(tiny):
  """Where a path still follows the data, the target's log p of its token after the path's
  prefix is the plain forward's log p of that token at the same position."""
  from vsd_jax.target_oracle import target_verdicts
  trainer, batch = tiny
  _, model, rows, ok, paths, data_oracle = _forward_and_paths(trainer, batch, "tree", 4, 4, 5)
  target = trainer.target.model
  oracle, logp = target_verdicts(target, batch["tokens"], rows, paths.tokens, model.d2t[...],
                                 trainer.frozen["t2d_index"])
  assert logp.shape == paths.tokens.shape and np.isfinite(np.asarray(logp)).all()
  tokens = np.asarray(batch["tokens"])
  t = tokens.shape[1]
  logits, _, _ = target(batch["tokens"], jnp.broadcast_to(jnp.arange(t), tokens.shape),
                        KVCache.create(target.cfg, tokens.shape[0], t))
  full = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32), -1))  # [B, T, V]
  ids = np.asarray(draft_to_target_ids(model.d2t[...], paths.tokens))
  length = np.asarray(accepted_length(paths.tokens, data_oracle))
  checked = 0
  for b, k, s_ in zip(*np.nonzero(np.asarray(ok)[:, :, None] & np.ones(ids.shape[:3], bool))):
    p = int(rows[b, k])
    for j in range(min(int(length[b, k, s_]) + 1, ids.shape[-1])):  # prefix on the data
      if p + 1 + j >= t:
        break
      np.testing.assert_allclose(float(logp[b, k, s_, j]), full[b, p + 1 + j, ids[b, k, s_, j]],
                                 atol=2e-4)
      checked += 1
  assert checked > 10


def test_expected_utility_trains_and_needs_the_target_oracle(tiny):
  trainer, batch = tiny
  cfg = dataclasses.replace(trainer.cfg, vsd_oracle="target", vsd_utility="expected")
  obj = _objective(trainer, cfg)
  (loss, m), g = _loss_and_grads(obj, trainer, batch, 3)
  assert np.isfinite(float(loss)) and obj.describe["vsd_utility"] == "expected"
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(g))
  accepted = _objective(trainer, dataclasses.replace(cfg, vsd_utility="accepted"))
  _, m_acc = _loss(accepted, trainer, batch, 3)
  # Same proposals and corrected paths; only the weights differ.
  assert float(m["loss_wl"]) != float(m_acc["loss_wl"])
  np.testing.assert_allclose(float(m["loss_car"]), float(m_acc["loss_car"]), rtol=1e-6)
  with pytest.raises(ValueError, match="vsd_utility=expected needs"):
    dataclasses.replace(trainer.cfg, vsd_utility="expected")
  with pytest.raises(ValueError, match="vsd_utility must be accepted or expected"):
    dataclasses.replace(trainer.cfg, vsd_utility="mean")


def test_vsd_with_the_target_oracle_trains(tiny):
  trainer, batch = tiny
  obj = _objective(trainer, dataclasses.replace(trainer.cfg, vsd_oracle="target"))
  (loss, m), g = _loss_and_grads(obj, trainer, batch, 3)
  (loss_d, m_d) = _loss(trainer.objective, trainer, batch, 3)
  assert np.isfinite(float(loss))
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(g))
  # Same proposals (same key); on greedy data the utilities agree up to the data's end.
  assert float(m["vsd_best_utility"]) >= float(m_d["vsd_best_utility"]) - 1e-6


def test_init_from_another_objectives_run(tiny, tmp_path):
  """--init-from: a baseline run starts from the VSD run's parameters (fresh optimiser and
  step); a different drafter kind is refused."""
  from vsd_jax.checkpointing import CheckpointMismatchError
  trainer, _ = tiny
  trainer.checkpointer.wait()
  cfg = trainer.cfg
  other = Trainer(cfg, make_mesh(1, 1, 1), str(tmp_path / "phase2"), objective="baseline",
                  log=lambda *_: None, progress=False, init_from=str(trainer.workdir))
  state, position = other.restore_or_init()
  assert int(state.step) == 0 and position.index == 0 and position.epoch == 0
  for a, b in zip(jax.tree_util.tree_leaves(state.params),
                  jax.tree_util.tree_leaves(trainer.state.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  other.close()
  medusa = with_overrides(get_preset("tiny_medusa"), [f"data_dir={cfg.data_dir}"])
  wrong = Trainer(medusa, make_mesh(1, 1, 1), str(tmp_path / "wrong"), log=lambda *_: None,
                  progress=False, init_from=str(trainer.workdir))
  with pytest.raises(CheckpointMismatchError, match="eagle3 drafter"):
    wrong.restore_or_init()
  wrong.close()
  empty = Trainer(cfg, make_mesh(1, 1, 1), str(tmp_path / "empty"), log=lambda *_: None,
                  progress=False, init_from=str(tmp_path / "nothing-here"))
  with pytest.raises(ValueError, match="--init-from: no checkpoint"):
    empty.restore_or_init()
  empty.close()
