"""The native few-rows matmul: exact enough, row-invariant bits, gradients, and where it applies."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import few_rows_matmul as frm

pytestmark = pytest.mark.skipif(not frm.native_available(),
                                reason="no C++ compiler for the native kernel")

_dot = frm.few_rows_matmul


def _dot_t(x, w_NxK):
  return frm.few_rows_matmul(x, w_NxK, transposed=True)


@pytest.mark.parametrize("m,k,n", [(1, 576, 1536), (6, 576, 1536), (5, 1536, 576), (12, 64, 192),
                                   (7, 17, 33), (3, 9, 200), (2, 1, 64)])
def test_matches_float64_reference(m, k, n):
  rng = np.random.default_rng(m * 1000 + k + n)
  x = rng.standard_normal((m, k), np.float32)
  w = rng.standard_normal((k, n), np.float32)
  ref = x.astype(np.float64) @ w.astype(np.float64)
  # float32 sums of k products: error grows like sqrt(k) * eps * |x||w|
  tol = 2e-6 * np.sqrt(k) * 8
  np.testing.assert_allclose(np.asarray(jax.jit(_dot)(x, w)), ref, rtol=0, atol=tol)
  w_NxK = np.ascontiguousarray(w.T)
  np.testing.assert_allclose(np.asarray(jax.jit(_dot_t)(x, w_NxK)), ref, rtol=0, atol=tol)


@pytest.mark.parametrize("k,n", [(576, 1536), (1536, 576), (40, 100)])
def test_each_row_gets_the_same_bits_whatever_the_other_rows(k, n):
  """What makes a verification block score a token exactly as a single decode step does."""
  rng = np.random.default_rng(k + n)
  x = rng.standard_normal((frm.MAX_ROWS, k), np.float32)
  w = rng.standard_normal((k, n), np.float32)
  for dot, w_ in ((_dot, w), (_dot_t, np.ascontiguousarray(w.T))):
    one_row = jax.jit(dot)
    singles = np.stack([np.asarray(one_row(x[i:i + 1], w_))[0] for i in range(len(x))])
    for m in (2, 6, 7, frm.MAX_ROWS):
      np.testing.assert_array_equal(np.asarray(jax.jit(dot)(x[:m], w_)), singles[:m])
    np.testing.assert_array_equal(np.asarray(jax.jit(dot)(x[3:9], w_)), singles[3:9])


def test_leading_dims_and_bias_through_nnx_linear():
  import flax.nnx as nnx
  layer = nnx.Linear(24, 40, use_bias=True, rngs=nnx.Rngs(0),
                     dot_general=frm.few_rows_dot_general)
  plain = nnx.Linear(24, 40, use_bias=True, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 3, 24))
  np.testing.assert_allclose(np.asarray(layer(x)), np.asarray(plain(x)), atol=1e-5)


@pytest.mark.parametrize("transposed", [False, True])
def test_gradients_equal_xla_dot(transposed):
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.standard_normal((4, 48), np.float32))
  w = jnp.asarray(rng.standard_normal((80, 48) if transposed else (48, 80), np.float32))
  g = jnp.asarray(rng.standard_normal((4, 80), np.float32))
  dot, ref_dot = (_dot_t, lambda x, w: x @ w.T) if transposed else (_dot, jnp.matmul)
  ours = jax.grad(lambda x, w: jnp.sum(dot(x, w) * g), argnums=(0, 1))(x, w)
  ref = jax.grad(lambda x, w: jnp.sum(ref_dot(x, w) * g), argnums=(0, 1))(x, w)
  for a, b in zip(ours, ref):
    assert np.all(np.isfinite(np.asarray(a)))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)


def _lowered(fn, *args) -> str:
  return jax.jit(fn).lower(*args).as_text()


def test_applies_only_to_float32_few_row_matmuls():
  w = jnp.ones((32, 64), jnp.float32)
  assert "asd_few_rows_matmul" in _lowered(_dot, jnp.ones((frm.MAX_ROWS, 32)), w)
  assert "asd_few_rows_matmul" in _lowered(_dot, jnp.ones((1, 3, 32)), w)
  assert "asd_few_rows_matmul_transposed" in _lowered(_dot_t, jnp.ones((1, 3, 64)), w)
  # more rows than the kernel is faster for (prefill, training), other dtypes, other contractions
  assert "asd_few_rows_matmul" not in _lowered(_dot, jnp.ones((frm.MAX_ROWS + 1, 32)), w)
  assert "asd_few_rows_matmul" not in _lowered(
      _dot, jnp.ones((2, 32), jnp.bfloat16), w.astype(jnp.bfloat16))
  batched = lambda x, w: frm.few_rows_dot_general(x, w, (((2,), (1,)), ((0,), (0,))))
  assert "asd_few_rows_matmul" not in _lowered(batched, jnp.ones((2, 3, 32)),
                                               jnp.ones((2, 32, 8)))


def test_inside_a_while_loop_and_vmap():
  w = jax.random.normal(jax.random.key(0), (16, 16)) / 4

  def steps(x):
    return jax.lax.fori_loop(0, 5, lambda _, h: jnp.tanh(_dot(h, w)), x)

  x = jax.random.normal(jax.random.key(1), (3, 2, 16))
  ref = x
  for _ in range(5):
    ref = jnp.tanh(ref @ w)
  np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(steps))(x)), np.asarray(ref),
                             atol=1e-5)


def test_switched_off_it_is_xla_dot_with_the_same_results():
  code = ("import jax.numpy as jnp, numpy as np; from models import few_rows_matmul as frm; "
          "x = jnp.arange(12.).reshape(2, 6); w = jnp.arange(18.).reshape(6, 3); "
          "assert not frm.native_available(); "
          "dims = (((1,), (0,)), ((), ())); "
          "y = frm.few_rows_dot_general(x, w, dims); "
          "np.testing.assert_array_equal(np.asarray(y), np.asarray(x @ w)); "
          "import jax; text = jax.jit(lambda x, w: frm.few_rows_dot_general(x, w, dims))"
          ".lower(x, w).as_text(); "
          "assert 'asd_few_rows' not in text and 'dot_general' in text, text; print('ok')")
  env = dict(os.environ, ASD_JAX_NATIVE="0")
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
