"""The native short-block attention equals the XLA reference and never reads a masked entry."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import block_attention as ba
from models.native_kernels import TARGETS, native_available

pytestmark = pytest.mark.skipif(not native_available(),
                                reason="no C++ compiler for the native kernels")


def _case(b, t, kv, g, h, s, seed, tree=False):
  """Random queries/keys/values and masks shaped like a decode block at random positions."""
  rng = np.random.default_rng(seed)
  f = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
  args = [f(b, t, kv * g, h), f(b, t, kv, h), f(b, t, kv, h), f(b, kv, h, s), f(b, kv, s, h)]
  lengths = rng.integers(0, s, size=b)
  old = np.arange(s)[None, None, :] < lengths[:, None, None]
  old = np.broadcast_to(old, (b, t, s)).copy()
  if tree:  # draft trees: each node sees a random subset of the block
    new = rng.random((b, t, t)) < 0.5
    new |= np.eye(t, dtype=bool)[None]
  else:
    new = np.broadcast_to(np.tril(np.ones((t, t), bool)), (b, t, t)).copy()
  return args + [old, new]


@pytest.mark.parametrize("b,t,kv,g,h,s,tree", [
    (1, 1, 3, 3, 64, 448, False),    # SmolLM2 decode step
    (1, 6, 3, 3, 64, 448, False),    # a K=5 verification
    (1, 17, 3, 3, 64, 200, True),    # a 17-node draft tree
    (2, 5, 2, 2, 16, 40, False),     # batch rows at different lengths
    (1, 3, 1, 4, 8, 19, True),       # head dim and capacity not whole vectors
])
def test_matches_the_xla_reference(b, t, kv, g, h, s, tree):
  args = _case(b, t, kv, g, h, s, seed=t * 100 + s, tree=tree)
  ref = np.asarray(jax.jit(ba.reference_attention)(*args))
  got = np.asarray(jax.jit(ba.block_attention)(*args))
  np.testing.assert_allclose(got, ref, rtol=1e-5, atol=2e-6)


def test_masked_entries_are_never_read():
  args = _case(2, 6, 3, 3, 64, 128, seed=1, tree=True)
  clean = np.asarray(jax.jit(ba.block_attention)(*args))
  q, k_new, v_new, k_cache, v_cache, old, new = (np.array(a) for a in args)
  hidden_slot = ~old[:, 0, :]                       # masked for every query of the row
  k_cache[:, :, :, :][np.broadcast_to(hidden_slot[:, None, None, :], k_cache.shape)] = np.nan
  v_cache[np.broadcast_to(hidden_slot[:, None, :, None], v_cache.shape)] = 1e30
  hidden_new = ~new.any(axis=1)                     # block entries no query sees
  k_new[hidden_new] = np.nan
  v_new[hidden_new] = np.nan
  poisoned = np.asarray(jax.jit(ba.block_attention)(q, k_new, v_new, k_cache, v_cache, old, new))
  np.testing.assert_array_equal(poisoned, clean)


def test_a_query_that_sees_nothing_gets_the_references_uniform_average():
  args = _case(1, 2, 1, 2, 16, 24, seed=2)
  args[5][:] = False
  args[6][:] = False
  np.testing.assert_allclose(np.asarray(jax.jit(ba.block_attention)(*args)),
                             np.asarray(jax.jit(ba.reference_attention)(*args)), atol=1e-5)


def test_gradients_are_the_references():
  args = [jnp.asarray(a) for a in _case(1, 4, 2, 2, 16, 32, seed=3)]
  cot = jnp.asarray(np.random.default_rng(4).standard_normal((1, 4, 64)), jnp.float32)
  loss = lambda fn: lambda *f: jnp.sum(fn(*f, *args[5:]) * cot)  # noqa: E731
  ours = jax.grad(loss(ba.block_attention), argnums=(0, 1, 2, 3, 4))(*args[:5])
  ref = jax.grad(loss(ba.reference_attention), argnums=(0, 1, 2, 3, 4))(*args[:5])
  for a, r in zip(ours, ref):
    np.testing.assert_allclose(np.asarray(a), np.asarray(r), rtol=1e-4, atol=1e-5)


def test_native_only_for_float32_and_vmap_works():
  args = _case(1, 2, 2, 2, 16, 32, seed=5)
  lowered = jax.jit(ba.block_attention).lower(*args).as_text()
  assert TARGETS["AsdBlockAttention"] in lowered
  bf16 = [a.astype(jnp.bfloat16) if a.dtype == np.float32 else a for a in args]
  assert TARGETS["AsdBlockAttention"] not in jax.jit(ba.block_attention).lower(*bf16).as_text()
  stacked = [np.stack([a, a]) for a in args]
  out = jax.jit(jax.vmap(ba.block_attention))(*stacked)
  np.testing.assert_allclose(np.asarray(out[1]), np.asarray(ba.reference_attention(*args)),
                             rtol=1e-5, atol=2e-6)
