"""EAGLE-3 and Medusa drafters: architecture, caching, vocabulary maps, checkpoints, interop."""

import json

import flax.nnx as nnx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.drafter_checkpoint import (DRAFTER_KEY, EAGLE3_ARCH, export_eagle3, import_eagle3,
                                       load_drafter, save_drafter)
from models.eagle3 import (Eagle3Config, check_vocab_map, draft_logits_to_target,
                           draft_to_target_ids, eagle3_default_layers, eagle3_fns, init_eagle3,
                           reduced_vocab_map, set_vocab_map)
from models.errors import CheckpointError
from models.hf_folder import load_hf_folder, save_hf_folder
from models.kv_cache import KVCache
from models.medusa import MedusaConfig, init_medusa, medusa_logits
from tests.tiny_models import random_decoder

B, T, VD = 2, 7, 40


def _randomize(model, seed):
  """Unit-scale weights and non-trivial norm scales, so every wiring mistake shows."""
  keys = iter(jax.random.split(jax.random.key(seed), 100))
  for path, var in nnx.iter_graph(model):
    if isinstance(var, nnx.Param):
      noise = jax.random.normal(next(keys), var.shape, jnp.float32)
      if path[-1] == "scale":
        value = 1 + 0.3 * noise
      elif path[-1] == "embedding":
        value = noise
      else:
        value = noise * var.shape[-2] ** -0.5 if var.ndim >= 2 else 0.3 * noise
      var.set_value(value.astype(var.dtype))
  return model


def _flat(model):
  return {"/".join(map(str, k)): np.asarray(v[...]) for k, v in nnx.to_flat_state(nnx.state(model))}


@pytest.fixture(scope="module")
def target():
  return random_decoder(seed=0, num_layers=6, tie_embeddings=True)


@pytest.fixture(scope="module")
def drafter(target):
  d = _randomize(init_eagle3(Eagle3Config.for_target(target.cfg, VD), seed=1), seed=2)
  d.embed.embedding.set_value(target.embed.embedding[...])  # shared with the target
  counts = np.random.RandomState(0).randint(0, 50, target.cfg.vocab_size)
  set_vocab_map(d, *reduced_vocab_map(counts, VD))
  return d


def _inputs(seed, width):
  rng = np.random.RandomState(seed)
  tokens = jnp.asarray(rng.randint(0, 97, (B, T)), jnp.int32)
  features = jnp.asarray(rng.randn(B, T, width), jnp.float32)
  return tokens, features, jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))


def _reference(d, tokens, features_3d):
  """EAGLE-3 as vLLM's llama_eagle3.py computes it, in float64 numpy (full causal forward)."""
  cfg, flat = d.cfg, _flat(d)
  get = lambda path: flat[path].astype(np.float64)
  rms = lambda x, w: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_norm_eps) * w
  h = np.asarray(features_3d, np.float64) @ get("fc/kernel")
  emb = get("embed/embedding")[np.asarray(tokens)]
  x = np.concatenate([rms(emb, get("layer/input_norm/scale")),
                      rms(h, get("layer/hidden_norm/scale"))], -1)
  n, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  ang = np.arange(T)[:, None] * np.asarray(d.inv_freq[...], np.float64)
  cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
  rope = lambda z: z * cos[:, None] + np.concatenate(
      [-z[..., hd // 2:], z[..., :hd // 2]], -1) * sin[:, None]
  q = rope((x @ get("layer/attn/q_proj/kernel")).reshape(B, T, n, hd))
  k = rope((x @ get("layer/attn/k_proj/kernel")).reshape(B, T, kv, hd))
  v = (x @ get("layer/attn/v_proj/kernel")).reshape(B, T, kv, hd)
  k, v = np.repeat(k, n // kv, axis=2), np.repeat(v, n // kv, axis=2)
  s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(hd) + np.triu(np.full((T, T), -np.inf), 1)
  p = np.exp(s - s.max(-1, keepdims=True))
  o = np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v).reshape(B, T, n * hd)
  h = h + o @ get("layer/attn/o_proj/kernel")  # residual: the un-normed fused hidden
  y = rms(h, get("layer/post_attn_norm/scale"))
  g, u = y @ get("layer/mlp/gate_proj/kernel"), y @ get("layer/mlp/up_proj/kernel")
  h = h + (g / (1 + np.exp(-g)) * u) @ get("layer/mlp/down_proj/kernel")
  return rms(h, get("final_norm/scale")) @ get("lm_head/kernel"), h


def test_config_defaults_follow_eagle3(target):
  # EAGLE-3 captures the inputs of layers 2, L//2, L-3 = outputs of 1, L//2-1, L-4.
  assert eagle3_default_layers(30) == (1, 14, 26)
  cfg = Eagle3Config.for_target(target.cfg, 40)
  assert cfg.fused_layers == (1, 2, 2)
  assert hash(cfg) == hash(Eagle3Config.for_target(target.cfg, 40, fused_layers=[1, 2, 2]))
  assert (cfg.num_heads, cfg.head_dim, cfg.intermediate_size) == (4, 16, 128)
  with pytest.raises(ValueError, match="fused_layers"):
    Eagle3Config.for_target(target.cfg, 40, fused_layers=(3, 1, 2))
  with pytest.raises(ValueError, match="draft_vocab_size"):
    Eagle3Config.for_target(target.cfg, 98)


def test_forward_matches_reference_and_feature_paths(drafter):
  fns, params = eagle3_fns(drafter)
  tokens, feats, pos = _inputs(0, 3 * 64)
  logits, hidden, _ = fns.step(params, tokens, feats, pos, fns.init_cache(B, 16))
  assert logits.shape == (B, T, VD) and logits.dtype == jnp.float32 and hidden.shape == (B, T, 64)
  ref_logits, ref_hidden = _reference(drafter, tokens, feats)
  np.testing.assert_allclose(logits, ref_logits, rtol=2e-4, atol=2e-4)
  np.testing.assert_allclose(hidden, ref_hidden, rtol=2e-4, atol=2e-4)
  # The Decoder's [B, T, 3, D] hidden and explicit fuse-then-step (a D-wide input) agree.
  same = [fns.step(params, tokens, f, pos, fns.init_cache(B, 16))[0] for f in
          (feats.reshape(B, T, 3, 64), fns.fuse(params, feats))]
  for other in same:
    np.testing.assert_allclose(other, logits, rtol=1e-5, atol=1e-5)
  # Later steps: the D-wide input is used as is (no fc), so own hidden states differ from fused.
  later = fns.step(params, tokens, hidden, pos, fns.init_cache(B, 16))[0]
  assert not np.allclose(later, logits, atol=1e-3)
  with pytest.raises(ValueError, match="features must be"):
    fns.step(params, tokens, feats[..., :100], pos, fns.init_cache(B, 16))


def test_cached_steps_equal_full_forward_and_causal(drafter):
  fns, params = eagle3_fns(drafter)
  step = jax.jit(fns.step)
  tokens, feats, pos = _inputs(1, 3 * 64)
  full_logits, full_hidden, _ = step(params, tokens, feats, pos, fns.init_cache(B, 12))
  cache, parts = fns.init_cache(B, 12), []
  for a, b in ((0, 3), (3, 4), (4, 7)):
    lg, hd, cache = step(params, tokens[:, a:b], feats[:, a:b], pos[:, a:b], cache)
    parts.append((lg, hd))
  np.testing.assert_allclose(jnp.concatenate([p[0] for p in parts], 1), full_logits, atol=1e-5)
  np.testing.assert_allclose(jnp.concatenate([p[1] for p in parts], 1), full_hidden, atol=1e-5)
  # Changing tokens and features from position 4 on leaves earlier positions untouched.
  tokens2 = tokens.at[:, 4:].set((tokens[:, 4:] + 1) % 97)
  feats2 = feats.at[:, 4:].add(1.0)
  logits2 = step(params, tokens2, feats2, pos, fns.init_cache(B, 12))[0]
  np.testing.assert_array_equal(logits2[:, :4], full_logits[:, :4])
  assert not np.allclose(logits2[:, 4:], full_logits[:, 4:])


def test_vocab_map_from_counts():
  counts = np.array([5, 0, 9, 9, 1, 0, 7, 3])
  d2t, t2d = reduced_vocab_map(counts, 4)
  assert d2t.dtype == np.int64 and t2d.dtype == bool
  np.testing.assert_array_equal(np.flatnonzero(t2d), [0, 2, 3, 6])  # the 4 most frequent
  np.testing.assert_array_equal(np.arange(4) + d2t, [0, 2, 3, 6])  # draft ids in id order
  np.testing.assert_array_equal(np.flatnonzero(reduced_vocab_map(np.zeros(8), 3)[1]), [0, 1, 2])
  ids = draft_to_target_ids(jnp.asarray(d2t), jnp.asarray([[3, 0], [1, 2]]))
  np.testing.assert_array_equal(ids, [[6, 0], [2, 3]])
  logits = jnp.arange(8.0).reshape(1, 2, 4)
  on_target = draft_logits_to_target(jnp.asarray(d2t), logits, 8)
  np.testing.assert_array_equal(on_target[..., t2d], logits)
  assert (on_target[..., ~t2d] < -1e29).all()
  cfg = Eagle3Config(hidden_size=8, target_vocab_size=8, draft_vocab_size=4, num_heads=2,
                     num_kv_heads=1, head_dim=4, intermediate_size=8, target_num_layers=6)
  check_vocab_map(d2t, t2d, cfg)
  with pytest.raises(ValueError, match="t2d does not mark"):
    check_vocab_map(d2t, np.roll(t2d, 1), cfg)
  with pytest.raises(ValueError, match="distinct"):
    check_vocab_map(np.array([0, 0, -1, 3]), t2d, cfg)  # 1 twice


@pytest.mark.parametrize("tied", [True, False])
def test_medusa_identity_head_gives_target_logits(tied):
  target = random_decoder(seed=3, num_layers=2, tie_embeddings=tied)
  tokens, _, pos = _inputs(2, 1)
  logits, hidden, _ = target(tokens, pos, KVCache.create(target.cfg, B, T), hidden_layers=(1,))
  last_hidden = target.final_norm(hidden[:, :, 0])  # Medusa reads the post-norm hidden state
  heads = init_medusa(MedusaConfig(64, 97, num_heads=3), seed=0)
  a, b = 0.7, jnp.linspace(-1, 1, 64)
  heads.res.kernel.set_value(heads.res.kernel[...].at[1].set(a * jnp.eye(64)))
  heads.res.bias.set_value(heads.res.bias[...].at[1].set(b))
  out = jax.jit(medusa_logits)(nnx.state(heads), last_hidden, target.head_VxD())
  assert out.shape == (B, T, 3, 97) and out.dtype == jnp.float32
  np.testing.assert_allclose(out[:, :, 0], logits, rtol=1e-5, atol=1e-5)  # zero ResBlock
  np.testing.assert_allclose(out[:, :, 2], logits, rtol=1e-5, atol=1e-5)
  x = np.asarray(last_hidden, np.float64)
  pre = a * x + np.asarray(b)
  expect = (x + pre / (1 + np.exp(-pre))) @ np.asarray(target.head_VxD(), np.float64).T
  np.testing.assert_allclose(out[:, :, 1], expect, rtol=1e-4, atol=1e-4)
  # Own heads start as copies of the target's head (Medusa's initialisation).
  own = init_medusa(MedusaConfig(64, 97, num_heads=2, own_head=True), seed=0, target=target)
  np.testing.assert_allclose(medusa_logits(nnx.state(own), last_hidden, None)[:, :, 1], logits,
                             rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="target_head_VxD"):
    medusa_logits(nnx.state(own), last_hidden, target.head_VxD())
  with pytest.raises(ValueError, match="target_head_VxD"):
    medusa_logits(nnx.state(heads), last_hidden, None)


def _step_logits(d):
  fns, params = eagle3_fns(d)
  tokens, feats, pos = _inputs(3, 3 * 64)
  return np.asarray(fns.step(params, tokens, feats, pos, fns.init_cache(B, T))[0])


def test_save_load_round_trip(target, drafter, tmp_path):
  folder = save_drafter(tmp_path / "e", drafter, dtype="float32", manifest={"steps": 1})
  hf, tensors = load_hf_folder(folder)
  assert hf[DRAFTER_KEY] == "eagle3" and "embed_tokens.weight" not in tensors
  assert json.loads((folder / "manifest.json").read_text()) == {"steps": 1}
  loaded = load_drafter(folder, target)
  assert loaded.cfg == drafter.cfg
  assert loaded.embed.embedding[...] is target.embed.embedding[...]  # one buffer, not a copy
  for name, value in _flat(drafter).items():
    np.testing.assert_array_equal(_flat(loaded)[name], value, err_msg=name)
  save_drafter(folder, drafter)  # bf16 by default; replaces the folder
  assert sorted(p.name for p in tmp_path.iterdir()) == ["e"]
  loaded16 = load_drafter(folder, target, dtype="bfloat16")
  assert loaded16.layer.attn.q_proj.kernel[...].dtype == jnp.bfloat16
  np.testing.assert_allclose(_step_logits(load_drafter(folder, target)), _step_logits(drafter),
                             rtol=0.05, atol=0.1)
  for own in (False, True):
    heads = _randomize(init_medusa(MedusaConfig(64, 97, 3, own_head=own)), seed=4)
    path = save_drafter(tmp_path / f"m{own}", heads, dtype="float32")
    assert (len(load_hf_folder(path)[1]) == 9) == own  # shared head: not stored
    for name, value in _flat(heads).items():
      np.testing.assert_array_equal(_flat(load_drafter(path, target))[name], value)
    save_drafter(path, heads)
    for name, value in _flat(heads).items():
      np.testing.assert_allclose(_flat(load_drafter(path, target))[name], value, rtol=1e-2,
                                 atol=1e-6)


def test_export_import_vllm_layout(target, drafter, tmp_path):
  folder = export_eagle3(tmp_path / "x", drafter, dtype="float32")
  hf, tensors = load_hf_folder(folder)
  assert hf["architectures"] == [EAGLE3_ARCH] and DRAFTER_KEY not in hf
  assert (hf["vocab_size"], hf["draft_vocab_size"], hf["hidden_size"]) == (97, VD, 64)
  assert hf["tie_word_embeddings"] is False and hf["num_hidden_layers"] == 1
  assert "eagle_aux_hidden_state_layer_ids" not in hf  # default layers: engines' default
  assert set(tensors) == {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"} | {
      f"midlayer.{n}.weight" for n in (
          "input_layernorm", "hidden_norm", "post_attention_layernorm", "self_attn.q_proj",
          "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
          "mlp.up_proj", "mlp.down_proj")}
  assert tensors["fc.weight"].shape == (64, 192) and tensors["lm_head.weight"].shape == (VD, 64)
  assert tensors["midlayer.self_attn.q_proj.weight"].shape == (64, 128)
  assert tensors["d2t"].dtype == np.int64 and tensors["t2d"].dtype == bool
  imported = import_eagle3(folder, target)
  for name, value in _flat(drafter).items():
    np.testing.assert_array_equal(_flat(imported)[name], value, err_msg=name)

  # A foreign checkpoint (no asd_jax keys, "model." prefixes, no t2d) with explicit layers:
  # vLLM's top-level ids name layer inputs, SGLang's eagle_config ids name layer outputs.
  foreign = {k: v for k, v in hf.items() if not k.startswith("asd_jax")}
  bare = {("model." + k if k.startswith("midlayer") else k): v for k, v in tensors.items()
          if k != "t2d"}
  for extra, fused in (({}, (1, 2, 2)),
                       ({"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}, (0, 2, 5)),
                       ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 2, 5]}},
                        (0, 2, 5))):
    save_hf_folder(tmp_path / "f", {**foreign, **extra}, bare)
    got = import_eagle3(tmp_path / "f", target)
    assert got.cfg.fused_layers == fused
    np.testing.assert_array_equal(got.t2d[...], drafter.t2d[...])
  moved = init_eagle3(Eagle3Config.for_target(target.cfg, VD, fused_layers=(0, 2, 5)))
  hf2, _ = load_hf_folder(export_eagle3(tmp_path / "y", moved))
  assert hf2["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
  assert hf2["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 5]


def test_drafter_for_another_target_is_refused(target, drafter, tmp_path):
  e = save_drafter(tmp_path / "e", drafter, dtype="float32")
  m = save_drafter(tmp_path / "m", init_medusa(MedusaConfig(64, 97, 2)), dtype="float32")
  wider = random_decoder(seed=5, num_layers=1, hidden=96, tie_embeddings=True)
  other_vocab = random_decoder(seed=5, vocab=120, num_layers=1, tie_embeddings=True)
  deeper = random_decoder(seed=5, num_layers=8, tie_embeddings=True)
  for folder in (e, m):
    for other, what in ((wider, "width 96"), (other_vocab, "vocabulary 120")):
      with pytest.raises(CheckpointError, match=what):
        load_drafter(folder, other)
  with pytest.raises(CheckpointError, match="6-layer target"):
    load_drafter(e, deeper)
  with pytest.raises(CheckpointError, match="not EAGLE-3"):
    import_eagle3(m, target)


def test_medusa_choices_enumerate_only_what_the_tree_keeps():
  import itertools
  import time
  from asd_jax.draft_tree import TreeShape
  from models.feature_drafters import medusa_choices

  def every_path(shape, heads):  # the definition: the first N of all paths in rank-sum order
    depth = min(shape.depth, heads)
    paths = sorted((p for d in range(1, depth + 1)
                    for p in itertools.product(range(shape.top_k), repeat=d)),
                   key=lambda p: (sum(p), len(p), p))
    return sorted(paths[:shape.num_nodes], key=lambda p: (len(p), p))

  for shape in (TreeShape(3, 3, 10), TreeShape(4, 2, 9), TreeShape(2, 4, 20), TreeShape(3, 1, 2)):
    for heads in (1, 2, 4):
      assert medusa_choices(shape, heads) == every_path(shape, heads)
  start = time.perf_counter()  # listing all 120**4 paths took minutes and gigabytes
  choices = medusa_choices(TreeShape(4, 120, 16), num_heads=4)
  assert len(choices) == 16 and time.perf_counter() - start < 1.0
