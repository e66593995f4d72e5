"""GGUF block-quantised weights in the layouts the native few-rows kernels read.

Why: a SmolLM2 decode step reads every weight once, and float32 weights are 540 MB where the
GGUF the model ships as holds them in 84 MB (Q4_1 projections, a Q8_0 embedding). The
checkpoint's float32 weights *are* these blocks dequantised (`gguf.quants`: d * q + m, and
d * q), and both products are exact in float32, so a kernel that rebuilds each weight in
registers computes with the same numbers, bit for bit, while streaming a fifth of the bytes.

Two layouts, one per kernel (see models/native/few_rows_matmul.cc):
- `Q4_1Records` for a Linear kernel w[K, N] (x @ w): uint8 records[K / 32, N / 32, 640], one
  per 32 rows x 32 columns: the columns' fp16 scales d, fp16 minima m, then 16 row pairs of 32
  bytes (low nibble: the even row, high nibble: the odd one), in the order a thread streams K.
- `Q8_0Rows` for a tied embedding E[N, K] used as the LM head (x @ E^T): int8 q[N, K] and
  float32 d[N, K / 32].

GGUF stores a Linear weight as HF's [out, in] = [N, K] rows of 32-weight blocks along K, so a
block never straddles two output rows and a row permutation (llama.cpp's Q/K RoPE order) can
be undone on the raw rows before packing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

QUANT_BLOCK = 32
"""Weights per GGUF block (Q4_1 and Q8_0), along the input dimension K."""

Q4_1_COLUMNS = 32
"""Columns of w[K, N] per Q4_1 record."""

_Q4_1_BLOCK_BYTES = 2 + 2 + QUANT_BLOCK // 2   # fp16 d, fp16 m, 16 bytes of nibbles
_Q8_0_BLOCK_BYTES = 2 + QUANT_BLOCK            # fp16 d, 32 int8


class Q4_1Records(NamedTuple):
  """A Linear kernel w[K, N]'s Q4_1 blocks: uint8 records[K / 32, N / 32, 640]."""
  records: np.ndarray


class Q8_0Rows(NamedTuple):
  """An embedding E[N, K]'s Q8_0 blocks: int8 q[N, K], float32 d[N, K / 32]; E = d * q."""
  q: np.ndarray
  d: np.ndarray


def _blocks(raw_NxB: np.ndarray, k: int, block_bytes: int, kind: str) -> np.ndarray:
  n = raw_NxB.shape[0]
  if k % QUANT_BLOCK or raw_NxB.shape != (n, k // QUANT_BLOCK * block_bytes):
    raise ValueError(f"{kind} rows of shape {raw_NxB.shape} do not hold {k} weights each "
                     f"in blocks of {QUANT_BLOCK}")
  return np.ascontiguousarray(raw_NxB, np.uint8).reshape(n, k // QUANT_BLOCK, block_bytes)


def _fp16_field(blocks_NxKBxB: np.ndarray, offset: int) -> np.ndarray:
  """The fp16 value at byte `offset` of every block, as float32 [N, K/32] (exact)."""
  return (blocks_NxKBxB[:, :, offset:offset + 2].copy().view(np.float16)[..., 0]
          .astype(np.float32))


def q4_1_weights(raw_NxB: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Decodes GGUF Q4_1 rows into (d f32[N, K/32], m f32[N, K/32], q uint8[N, K] in 0..15)."""
  blocks = _blocks(raw_NxB, k, _Q4_1_BLOCK_BYTES, "Q4_1")
  d, m = _fp16_field(blocks, 0), _fp16_field(blocks, 2)
  nibbles = blocks[:, :, 4:]
  # ggml's order: byte j holds element j (low nibble) and element j + 16 (high nibble).
  q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1).reshape(raw_NxB.shape[0], k)
  return d, m, q


def pack_q4_1(raw_NxB: np.ndarray, k: int) -> Q4_1Records:
  """GGUF Q4_1 rows of w^T (HF [N, K]) -> the kernel's records for w[K, N].

  Raises ValueError when N is not a multiple of Q4_1_COLUMNS or the rows are not K weights.
  """
  n = raw_NxB.shape[0]
  if n % Q4_1_COLUMNS:
    raise ValueError(f"Q4_1 records need N % {Q4_1_COLUMNS} == 0, got N = {n}")
  blocks = _blocks(raw_NxB, k, _Q4_1_BLOCK_BYTES, "Q4_1")
  kb, tiles = k // QUANT_BLOCK, n // Q4_1_COLUMNS

  def per_column(field_NxKBx2):  # [N, KB, 2] fp16 bytes -> [KB, tiles, 64]
    return field_NxKBx2.transpose(1, 0, 2).reshape(kb, tiles, 2 * Q4_1_COLUMNS)

  _, _, q_NxK = q4_1_weights(raw_NxB, k)
  q_KBx32xN = q_NxK.reshape(n, kb, QUANT_BLOCK).transpose(1, 2, 0)
  pairs = q_KBx32xN[:, 0::2, :] | (q_KBx32xN[:, 1::2, :] << 4)          # [KB, 16, N]
  pairs = pairs.reshape(kb, QUANT_BLOCK // 2, tiles, Q4_1_COLUMNS).transpose(0, 2, 1, 3)
  records = np.concatenate([per_column(blocks[:, :, 0:2]), per_column(blocks[:, :, 2:4]),
                            pairs.reshape(kb, tiles, -1)], axis=-1)
  return Q4_1Records(np.ascontiguousarray(records, np.uint8))


def pack_q8_0(raw_NxB: np.ndarray, k: int) -> Q8_0Rows:
  """GGUF Q8_0 rows of E[N, K] -> the kernel's (q int8[N, K], d float32[N, K / 32])."""
  blocks = _blocks(raw_NxB, k, _Q8_0_BLOCK_BYTES, "Q8_0")
  d = _fp16_field(blocks, 0)
  q = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(raw_NxB.shape[0], k)
  return Q8_0Rows(q=q, d=np.ascontiguousarray(d))
