"""GGUF weight blocks on the native kernels: the same weights, the same bits, fewer bytes."""

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import block_quant as bq
from models import few_rows_matmul as frm
from models import registry
from models.hf_params import attach_weight_blocks
from models.kv_cache import KVCache
from models.load import load_decoder

pytestmark = [pytest.mark.skipif(not frm.native_available(),
                                 reason="no C++ compiler for the native kernel"),
              pytest.mark.usefixtures("no_compilation_cache_writes")]

Q = gguf.GGMLQuantizationType


def _quantised(n, k, qtype, seed=0):
  """(raw GGUF rows, their float32 dequantisation) of a random [n, k] weight."""
  w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.1
  raw = gguf.quants.quantize(w, qtype)
  return raw, gguf.quants.dequantize(raw, qtype).astype(np.float32)


def test_q4_1_decode_is_ggufs_dequantisation_exactly():
  raw, w = _quantised(96, 128, Q.Q4_1)
  d, m, q = bq.q4_1_weights(raw, 128)
  assert q.min() >= 0 and q.max() <= 15
  rebuilt = np.repeat(d, 32, axis=1) * q + np.repeat(m, 32, axis=1)
  np.testing.assert_array_equal(rebuilt.astype(np.float32), w)


def test_q8_0_pack_is_ggufs_dequantisation_exactly():
  raw, w = _quantised(40, 96, Q.Q8_0)
  packed = bq.pack_q8_0(raw, 96)
  np.testing.assert_array_equal(np.repeat(packed.d, 32, axis=1) * packed.q, w)


def test_pack_rejects_shapes_it_cannot_hold():
  raw, _ = _quantised(48, 64, Q.Q4_1)
  with pytest.raises(ValueError, match="N % 32"):
    bq.pack_q4_1(raw, 64)  # 48 columns: not whole records
  raw, _ = _quantised(64, 64, Q.Q4_1)
  with pytest.raises(ValueError, match="do not hold 96 weights"):
    bq.pack_q4_1(raw, 96)


@pytest.mark.parametrize("n,k", [(1536, 576), (576, 1536), (96, 64), (32, 32)])
def test_q4_1_kernel_gives_the_float32_kernels_bits(n, k):
  raw, w_NxK = _quantised(n, k, Q.Q4_1, seed=n + k)
  w_KxN = jnp.asarray(np.ascontiguousarray(w_NxK.T))
  records = bq.pack_q4_1(raw, k)
  fp32 = jax.jit(lambda x: frm.few_rows_matmul(x, w_KxN))
  blocks = jax.jit(lambda x: frm.few_rows_matmul(x, w_KxN, blocks=records))
  rng = np.random.default_rng(k)
  for m in (1, 2, 5, 6, 7, frm.MAX_ROWS):
    x = rng.standard_normal((m, k), np.float32)
    np.testing.assert_array_equal(np.asarray(blocks(x)), np.asarray(fp32(x)))
  # and both are the product with those weights
  np.testing.assert_allclose(np.asarray(blocks(x)), x.astype(np.float64) @ w_KxN,
                             atol=1e-5 * np.sqrt(k), rtol=0)


@pytest.mark.parametrize("n,k", [(49152, 576), (100, 64)])
def test_q8_0_head_gives_the_float32_heads_bits(n, k):
  raw, e_NxK = _quantised(n, k, Q.Q8_0, seed=n)
  packed = bq.pack_q8_0(raw, k)
  fp32 = jax.jit(lambda x: frm.few_rows_matmul(x, e_NxK, transposed=True))
  blocks = jax.jit(lambda x: frm.few_rows_matmul(x, e_NxK, transposed=True, blocks=packed))
  rng = np.random.default_rng(n)
  for m in (1, 3, 6, frm.MAX_ROWS):
    x = rng.standard_normal((m, k), np.float32)
    np.testing.assert_array_equal(np.asarray(blocks(x)), np.asarray(fp32(x)))


def test_blocks_apply_only_where_they_match():
  raw, w_NxK = _quantised(64, 64, Q.Q4_1)
  w = jnp.asarray(np.ascontiguousarray(w_NxK.T))
  records = bq.pack_q4_1(raw, 64)
  uses_blocks = lambda fn, x: frm._Q4_1_TARGET in jax.jit(fn).lower(x).as_text()  # noqa: E731
  assert uses_blocks(lambda x: frm.few_rows_matmul(x, w, blocks=records), jnp.ones((6, 64)))
  # past MAX_ROWS only the blocks kernel still beats XLA's dot; past MAX_BLOCKS_ROWS neither
  assert uses_blocks(lambda x: frm.few_rows_matmul(x, w, blocks=records),
                     jnp.ones((frm.MAX_BLOCKS_ROWS, 64)))
  assert not uses_blocks(lambda x: frm.few_rows_matmul(x, w, blocks=records),
                         jnp.ones((frm.MAX_BLOCKS_ROWS + 1, 64)))
  # blocks of another shape are never read in place of w
  other = jnp.ones((64, 32), jnp.float32)
  assert not uses_blocks(lambda x: frm.few_rows_matmul(x, other, blocks=records),
                         jnp.ones((2, 64)))
  with pytest.raises(TypeError, match="unknown weight blocks"):
    frm.few_rows_matmul(jnp.ones((2, 64)), w, blocks=("not", "blocks"))


def test_gradients_through_the_blocks_path_use_the_float32_weights():
  raw, w_NxK = _quantised(64, 64, Q.Q4_1)
  w = jnp.asarray(np.ascontiguousarray(w_NxK.T))
  records = bq.pack_q4_1(raw, 64)
  x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 64), np.float32))
  g = jnp.asarray(np.random.default_rng(2).standard_normal((3, 64), np.float32))
  ours = jax.grad(lambda x, w: jnp.sum(frm.few_rows_matmul(x, w, blocks=records) * g),
                  argnums=(0, 1))(x, w)
  ref = jax.grad(lambda x, w: jnp.sum((x @ w) * g), argnums=(0, 1))(x, w)
  for a, b in zip(ours, ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------- a whole GGUF decoder

@pytest.fixture
def quantised_gguf(tmp_path, monkeypatch):
  """A tiny tied llama stored as SmolLM2's GGUF is: Q4_1 projections, a Q8_0 embedding."""
  pytest.importorskip("torch")
  from tests import test_loaders
  monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))
  # widths in whole 32-weight blocks and 32-column records
  monkeypatch.setitem(test_loaders.TINY, "hidden_size", 64)
  monkeypatch.setitem(test_loaders.TINY, "intermediate_size", 128)
  model = test_loaders.tiny_model("llama", tie=True)
  qtypes = {name: Q.Q4_1 for name in model.state_dict()
            if name.endswith("proj.weight")}
  qtypes["model.embed_tokens.weight"] = Q.Q8_0
  return test_loaders.write_gguf(tmp_path / "m.gguf", model, "llama", qtypes)


def _step(loaded, tokens):
  """(jitted forward, its args) for `tokens` from position 0."""
  args = (jnp.asarray([tokens], jnp.int32), jnp.arange(len(tokens), dtype=jnp.int32)[None],
          KVCache.create(loaded.cfg, 1, 64))
  return jax.jit(lambda tok, pos, c: loaded.model(tok, pos, c)[0]), args


def _step_logits(loaded, tokens):
  fn, args = _step(loaded, tokens)
  return np.asarray(fn(*args))


def test_gguf_decoder_with_blocks_gives_the_same_logits_bit_for_bit(quantised_gguf):
  with_blocks = load_decoder(quantised_gguf)
  without = load_decoder(quantised_gguf, weight_blocks=False)
  layer = with_blocks.model.layers[1]
  for proj in (layer.attn.q_proj, layer.attn.k_proj, layer.attn.v_proj, layer.attn.o_proj,
               layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
    assert proj.q4_1 is not None
  assert with_blocks.model.head_q8_0_q is not None
  assert without.model.layers[1].attn.q_proj.q4_1 is None
  fn, args = _step(with_blocks, [5, 17, 3])
  lowered = fn.lower(*args).as_text()
  assert frm._Q4_1_TARGET in lowered and frm._Q8_0_TARGET in lowered
  for tokens in ([5], [5, 17, 3, 40, 2, 9], list(range(3, 3 + frm.MAX_ROWS)),
                 list(range(3, 3 + frm.MAX_BLOCKS_ROWS + 2))):  # the last: XLA's dot on both
    np.testing.assert_array_equal(_step_logits(with_blocks, tokens),
                                  _step_logits(without, tokens))
  # between the two limits only the blocks side is the kernel: equal up to summation order
  tokens = list(range(3, 23))
  np.testing.assert_allclose(_step_logits(with_blocks, tokens), _step_logits(without, tokens),
                             rtol=0, atol=1e-4)


def test_blocks_rows_get_the_same_bits_whatever_the_other_rows():
  """Up to MAX_BLOCKS_ROWS: a tree's verification scores each node as a single step would."""
  raw, w_NxK = _quantised(64, 96, Q.Q4_1, seed=3)
  w = jnp.asarray(np.ascontiguousarray(w_NxK.T))
  records = bq.pack_q4_1(raw, 96)
  x = np.random.default_rng(4).standard_normal((frm.MAX_BLOCKS_ROWS, 96), np.float32)
  matmul = jax.jit(lambda x: frm.few_rows_matmul(x, w, blocks=records))
  singles = np.concatenate([np.asarray(matmul(x[i:i + 1])) for i in range(len(x))])
  for m in (13, 20, frm.MAX_BLOCKS_ROWS):
    np.testing.assert_array_equal(np.asarray(matmul(x[:m])), singles[:m])


def test_weight_blocks_are_cached_and_a_damaged_cache_is_rebuilt(quantised_gguf, monkeypatch):
  first = registry.load_weight_blocks(quantised_gguf)
  assert {kind for kind, _ in first.values()} == {"Q4_1", "Q8_0"}

  def must_not_read(path):
    raise AssertionError("the GGUF was read again")

  with monkeypatch.context() as patched:
    patched.setattr(registry, "load_gguf_blocks", must_not_read)
    cached = registry.load_weight_blocks(quantised_gguf)
  assert sorted(cached) == sorted(first)
  for name, (kind, rows) in first.items():
    assert cached[name][0] == kind
    np.testing.assert_array_equal(cached[name][1], rows)
  folder = registry.cache_entry_dir(registry.resolve_checkpoint(quantised_gguf)) / "weight_blocks"
  (folder / "rows.npz").write_bytes(b"not a zip file")
  rebuilt = registry.load_weight_blocks(quantised_gguf)
  assert sorted(rebuilt) == sorted(first)
  for name, (kind, rows) in first.items():  # rebuilt from the GGUF, not read from the damage
    assert rebuilt[name][0] == kind
    np.testing.assert_array_equal(rebuilt[name][1], rows)


def test_no_blocks_for_bfloat16_or_without_the_native_kernel(quantised_gguf, monkeypatch):
  bf16 = load_decoder(quantised_gguf, dtype="bfloat16")
  assert bf16.model.layers[0].attn.q_proj.q4_1 is None
  assert attach_weight_blocks(bf16.model, registry.load_weight_blocks(quantised_gguf)) == 0
  import models.load
  monkeypatch.setattr(models.load, "native_available", lambda: False)
  assert load_decoder(quantised_gguf).model.head_q8_0_q is None


@pytest.mark.parametrize("weight_blocks", [True, False])
def test_a_verification_block_scores_each_token_as_single_steps_do(quantised_gguf, weight_blocks):
  """Row-invariant matmuls and attention: verifying K tokens at once gives each token the
  bits that K single decode steps give it, so strict verification is plain decoding exactly."""
  loaded = load_decoder(quantised_gguf, weight_blocks=weight_blocks)
  step = jax.jit(lambda tok, pos, c: loaded.model(tok, pos, c))
  prompt, block = list(range(5, 25)), [7, 3, 90, 41, 12, 66]
  cache = KVCache.create(loaded.cfg, 1, 64)
  _, _, cache = step(jnp.asarray([prompt], jnp.int32), jnp.arange(20, dtype=jnp.int32)[None],
                     cache)
  together, _, _ = step(jnp.asarray([block], jnp.int32),
                        jnp.arange(20, 26, dtype=jnp.int32)[None], cache)
  singles = []
  for j, token in enumerate(block):
    logits, _, cache = step(jnp.asarray([[token]], jnp.int32),
                            jnp.asarray([[20 + j]], jnp.int32), cache)
    singles.append(np.asarray(logits)[0, 0])
  np.testing.assert_array_equal(np.asarray(together)[0], np.stack(singles))


def test_a_drafter_sharing_the_embedding_shares_the_head_blocks(quantised_gguf, tmp_path):
  """Same bits as with the float32 head, from the target's Q8_0 blocks (no copy of them)."""
  import dataclasses
  from models.drafter_folder import load_standalone_drafter, save_standalone_drafter
  from models.llama import init_decoder
  with_blocks = load_decoder(quantised_gguf)
  without = load_decoder(quantised_gguf, weight_blocks=False)
  cfg = dataclasses.replace(with_blocks.cfg, num_layers=1)
  folder = save_standalone_drafter(tmp_path / "d", init_decoder(cfg, seed=5), {}, dtype="float32")
  drafter = load_standalone_drafter(folder, with_blocks)
  plain = load_standalone_drafter(folder, without)
  assert drafter.head_q8_0_q[...] is with_blocks.model.head_q8_0_q[...]
  assert plain.head_q8_0_q is None
  assert load_standalone_drafter(folder, with_blocks, dtype="bfloat16").head_q8_0_q is None
  tokens = jnp.asarray([[5, 17, 3, 40]], jnp.int32)
  positions = jnp.arange(4, dtype=jnp.int32)[None]

  def logits(model):
    fn = jax.jit(lambda t, p, c: model(t, p, c)[0])
    return np.asarray(fn(tokens, positions, KVCache.create(cfg, 1, 16)))

  fn = jax.jit(lambda t, p, c: drafter(t, p, c)[0])
  assert frm._Q8_0_TARGET in fn.lower(tokens, positions, KVCache.create(cfg, 1, 16)).as_text()
  np.testing.assert_array_equal(logits(drafter), logits(plain))
