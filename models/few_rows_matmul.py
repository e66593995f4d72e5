"""x @ w for a few rows on the CPU backend: a native kernel behind an XLA FFI custom call.

Why: decode steps and verification blocks multiply 1-12 rows by every weight matrix. XLA:CPU
runs one row at about memory speed but sends 2-16 rows to a GEMM path that streams the weights
far slower (2-core Xeon, SmolLM2's 30 MLP blocks: 12.1 ms at 1 row, 18.6 at 2, 25.9 at 6). The
kernel in native/few_rows_matmul.cc streams them once per 6 rows (11.0 / 11.6 / 12.8 ms there;
`scripts/bench_few_rows_matmul.py`) and gives every row the same bits whatever the other rows,
so a verification block scores its tokens exactly as single steps would.

A GGUF target also keeps its Q4_1/Q8_0 blocks (models/block_quant.py); given those as
`blocks=`, the kernel rebuilds every weight exactly in registers instead of reading its float32
copy: the same bits from a fifth of the bytes (30 MLP blocks, 1 row: 10.4 -> 2.3 ms; 6 rows:
12.2 -> 5.3 ms).

`few_rows_dot_general` has `jax.lax.dot_general`'s signature (it is what `nnx.Linear` calls);
`few_rows_matmul` is the same for a plain `x @ w` or `x @ w^T` (the LM heads). Both send
float32 `x[..., K] @ w` with at most `MAX_ROWS` rows to the kernel when the
computation is lowered for the CPU; anything else, and every other platform, is
`jax.lax.dot_general` unchanged. The kernel is compiled on first use for this CPU
(models/native_kernels.py); where that is not possible a warning says so once and XLA's dot
is used; `ASD_JAX_NATIVE=0` chooses XLA's dot without a warning.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.block_quant import Q4_1_COLUMNS, QUANT_BLOCK, Q4_1Records, Q8_0Rows
from models.native_kernels import TARGETS, native_available

MAX_ROWS = 12
"""Rows up to which the kernel beats XLA's dot (it passes over the weights once per 6 rows)."""

MAX_BLOCKS_ROWS = 48
"""The same for the kernel on GGUF blocks, which streams 6x fewer bytes per pass."""

_TARGETS = {False: TARGETS["AsdFewRowsMatmul"], True: TARGETS["AsdFewRowsMatmulTransposed"]}
_Q4_1_TARGET = TARGETS["AsdFewRowsMatmulQ4_1"]
_Q8_0_TARGET = TARGETS["AsdFewRowsMatmulTransposedQ8_0"]


def _xla_matmul(x_MxK, w, transposed: bool):
  return x_MxK @ (w.T if transposed else w)


def _native_matmul(x_MxK, w, transposed: bool):
  out = jax.ShapeDtypeStruct((x_MxK.shape[0], w.shape[0] if transposed else w.shape[1]),
                             jnp.float32)
  return jax.ffi.ffi_call(_TARGETS[transposed], out, vmap_method="sequential")(x_MxK, w)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul_2d(x_MxK, w, transposed: bool):
  """x[M, K] @ w[K, N], or x @ w.T for w[N, K] when `transposed`."""
  return jax.lax.platform_dependent(
      x_MxK, w, cpu=functools.partial(_native_matmul, transposed=transposed),
      default=functools.partial(_xla_matmul, transposed=transposed))


def _fwd(x_MxK, w, transposed):
  return _matmul_2d(x_MxK, w, transposed), (x_MxK, w)


def _bwd(transposed, residuals, g_MxN):
  x_MxK, w = residuals
  if transposed:
    return g_MxN @ w, g_MxN.T @ x_MxK
  return g_MxN @ w.T, x_MxK.T @ g_MxN


_matmul_2d.defvjp(_fwd, _bwd)


def _native_blocks_matmul(x_MxK, w, blocks):
  del w  # the same numbers as `blocks`, in float32: read by the other platforms and backward
  if isinstance(blocks, Q4_1Records):
    out = jax.ShapeDtypeStruct((x_MxK.shape[0], blocks.records.shape[1] * Q4_1_COLUMNS),
                               jnp.float32)
    return jax.ffi.ffi_call(_Q4_1_TARGET, out, vmap_method="sequential")(x_MxK, blocks.records)
  out = jax.ShapeDtypeStruct((x_MxK.shape[0], blocks.q.shape[0]), jnp.float32)
  return jax.ffi.ffi_call(_Q8_0_TARGET, out, vmap_method="sequential")(x_MxK, blocks.q,
                                                                       blocks.d)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _blocks_matmul_2d(x_MxK, w, transposed: bool, blocks):
  """`_matmul_2d` reading `blocks` (the same weights, quantised) on the CPU."""
  return jax.lax.platform_dependent(
      x_MxK, w, blocks, cpu=_native_blocks_matmul,
      default=lambda x, w, blocks: _xla_matmul(x, w, transposed))


def _blocks_fwd(x_MxK, w, transposed, blocks):
  return _blocks_matmul_2d(x_MxK, w, transposed, blocks), (x_MxK, w, blocks)


def _blocks_bwd(transposed, residuals, g_MxN):
  x_MxK, w, blocks = residuals
  gx, gw = _bwd(transposed, (x_MxK, w), g_MxN)
  return gx, gw, jax.tree_util.tree_map(lambda b: np.zeros(b.shape, jax.dtypes.float0), blocks)


_blocks_matmul_2d.defvjp(_blocks_fwd, _blocks_bwd)


def few_rows_dot_general(lhs, rhs, dimension_numbers, precision=None,
                         preferred_element_type=None, blocks=None, **kwargs):
  """`jax.lax.dot_general`, with float32 few-row `x[..., K] @ w` on the native kernel.

  w is [K, N] (contracting dim 0, a Linear kernel) or [N, K] (contracting dim 1, a tied
  embedding used as the LM head). `blocks` (`Q4_1Records` for a [K, N] kernel, `Q8_0Rows` for
  an [N, K] head) are w's GGUF blocks: the kernel then reads those instead of w, and gives
  the same bits at a fraction of the bytes; w still serves more rows, other platforms and
  gradients.
  """
  (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = dimension_numbers
  rows = int(np.prod(lhs.shape[:-1]))
  transposed = tuple(rhs_contract) == (1,)
  if (tuple(lhs_contract) == (lhs.ndim - 1,) and tuple(rhs_contract) in ((0,), (1,))
      and not lhs_batch and not rhs_batch and rhs.ndim == 2 and rows >= 1
      and lhs.dtype == jnp.float32 and rhs.dtype == jnp.float32
      and preferred_element_type in (None, jnp.float32) and not kwargs.get("out_sharding")
      and native_available()):
    x_MxK = lhs.reshape(rows, lhs.shape[-1])
    y_MxN = None
    if blocks is not None and rows <= MAX_BLOCKS_ROWS and _blocks_match(blocks, rhs, transposed):
      y_MxN = _blocks_matmul_2d(x_MxK, rhs, transposed, blocks)
    elif rows <= MAX_ROWS:
      y_MxN = _matmul_2d(x_MxK, rhs, transposed)
    if y_MxN is not None:
      return y_MxN.reshape(*lhs.shape[:-1], y_MxN.shape[1])
  return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                             preferred_element_type=preferred_element_type, **kwargs)


def few_rows_matmul(x, w, *, transposed: bool = False, preferred_element_type=None,
                    blocks=None):
  """x[..., K] @ w[K, N], or x @ w^T for w[N, K] when `transposed`, via few_rows_dot_general."""
  contract = 1 if transposed else 0
  return few_rows_dot_general(x, w, (((x.ndim - 1,), (contract,)), ((), ())),
                              preferred_element_type=preferred_element_type, blocks=blocks)


def _blocks_match(blocks, w, transposed: bool) -> bool:
  """Whether `blocks` are laid out for w's orientation and shape (else w is used as is)."""
  if isinstance(blocks, Q4_1Records):
    kb, tiles, _ = blocks.records.shape
    return not transposed and w.shape == (kb * QUANT_BLOCK, tiles * Q4_1_COLUMNS)
  if isinstance(blocks, Q8_0Rows):
    return transposed and w.shape == blocks.q.shape
  raise TypeError(f"unknown weight blocks {type(blocks).__name__}")
