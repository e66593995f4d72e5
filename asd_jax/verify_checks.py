"""Input checks shared by the verification rules, run at the Python boundary before tracing.

Shapes: B batch rows, K draft block length, V vocabulary, N tree nodes.

Structural checks (rank, shape agreement, dtype) always run: shapes and dtypes are static,
so they hold for tracers too. Value checks (token ids inside the vocabulary, ledger and
parents well formed) need the values on the host; they run only on concrete arrays and are
skipped, by design, for tracers, so every rule stays callable inside a jitted decode loop.
Callers on a hot path can skip them with `check_values=False` (a concrete check reads the
array back from the device).
"""

from __future__ import annotations

import numbers

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(x) -> bool:
  """True when `x` has values on hand (not a tracer inside jit/vmap/grad)."""
  return not isinstance(x, jax.core.Tracer)


def as_array(x, name: str):
  """Keeps jax/numpy arrays (and tracers) as they are; turns lists and scalars into numpy."""
  if isinstance(x, (jax.Array, np.ndarray)):
    return x
  try:
    return np.asarray(x)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{name} must be an array, got {type(x).__name__}") from e


def tokens(x, name: str, ndim: int = 2):
  """Checks an integer id array of rank `ndim`; returns it as int32."""
  x = as_array(x, name)
  if not jnp.issubdtype(x.dtype, jnp.integer):
    raise TypeError(f"{name} must hold integer token ids, got dtype {x.dtype}")
  if x.ndim != ndim:
    raise ValueError(f"{name} must be {ndim}-D, got shape {tuple(x.shape)}")
  if x.dtype == jnp.int32:
    return x
  if is_concrete(x) and x.size:
    # Checked before the cast, which would wrap such ids into the vocabulary silently.
    a = np.asarray(x)
    info = np.iinfo(np.int32)
    if a.min() < info.min or a.max() > info.max:
      raise ValueError(f"{name} holds ids outside the int32 range: min {a.min()}, max {a.max()}")
  return jnp.asarray(x, jnp.int32)


def logits(x, name: str, shape: tuple[int, ...]):
  """Checks a floating logits array against `shape` (its last entry, V, is free if None)."""
  x = as_array(x, name)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    raise TypeError(f"{name} must be floating point (f32, bf16, f16), got dtype {x.dtype}")
  want = tuple(x.shape[-1] if s is None else s for s in shape)
  if x.ndim != len(shape) or tuple(x.shape) != want:
    pretty = ", ".join("V" if s is None else str(s) for s in shape)
    raise ValueError(f"{name} must have shape ({pretty}), got {tuple(x.shape)}")
  if x.shape[-1] < 1:
    raise ValueError(f"{name} has an empty vocabulary axis (V=0)")
  return jnp.asarray(x)


def block(draft_tokens, target_logits, draft_name="draft_tokens", logits_name="target_logits"):
  """Checks a chain block: draft int[B, K] with K >= 1 and logits float[B, K+1, V].

  Returns (draft int32[B, K], logits [B, K+1, V], V).
  """
  draft = tokens(draft_tokens, draft_name)
  b, k = draft.shape
  if k == 0:
    raise ValueError(f"{draft_name} has K=0 draft positions; a block needs K >= 1")
  z = logits(target_logits, logits_name, (b, k + 1, None))
  return draft, z, z.shape[-1]


def token_range(x, vocab: int, name: str, check_values: bool = True) -> None:
  """Raises if a concrete id array holds ids outside [0, vocab)."""
  if not check_values or not is_concrete(x) or x.size == 0:
    return
  a = np.asarray(x)
  lo, hi = int(a.min()), int(a.max())
  if lo < 0 or hi >= vocab:
    raise ValueError(f"{name} holds ids outside the vocabulary [0, {vocab}): min {lo}, max {hi}")


def ledger(spent, batch: int, check_values: bool = True):
  """Checks the regret ledger float[B] (finite, >= 0); returns it as float32."""
  spent = as_array(spent, "spent")
  if not (jnp.issubdtype(spent.dtype, jnp.floating) or jnp.issubdtype(spent.dtype, jnp.integer)):
    raise TypeError(f"spent must be a real array, got dtype {spent.dtype}")
  if tuple(spent.shape) != (batch,):
    raise ValueError(f"spent must have shape ({batch},) (one ledger per row), got "
                     f"{tuple(spent.shape)}")
  if check_values and is_concrete(spent) and batch:
    a = np.asarray(spent, np.float64)
    if not np.all(np.isfinite(a)):
      raise ValueError("spent holds non-finite values")
    if a.min() < 0:
      raise ValueError(f"spent must be >= 0, got min {a.min()}")
  return jnp.asarray(spent, jnp.float32)


def draft_lengths(lengths, batch: int, k: int, check_values: bool = True):
  """Checks per-row draft lengths int[B] in [0, K] (None: all K); returns them as int32."""
  if lengths is None:
    return jnp.full((batch,), k, jnp.int32)
  lengths = as_array(lengths, "draft_lengths")
  if tuple(lengths.shape) != (batch,) or not jnp.issubdtype(lengths.dtype, jnp.integer):
    raise ValueError(f"draft_lengths must be int[{batch}], got {lengths.dtype}"
                     f"{tuple(lengths.shape)}")
  if check_values and is_concrete(lengths):
    a = np.asarray(lengths)
    bad = a[(a < 0) | (a > k)]
    if bad.size:
      raise ValueError(f"draft_lengths must be in [0, {k}], got {int(bad[0])}")
  return jnp.asarray(lengths, jnp.int32)


def noise_slots(slots, k: int) -> int:
  """Resolves the static count of acceptance uniforms (None means K); at least K."""
  if slots is None:
    return k
  if isinstance(slots, bool) or not isinstance(slots, numbers.Integral) or slots < k:
    raise ValueError(f"noise_slots must be an int >= K = {k}, got {slots!r}")
  return int(slots)


def config(cfg, cls) -> None:
  if not isinstance(cfg, cls):
    raise TypeError(f"config must be an {cls.__name__}, got {type(cfg).__name__}")


def max_depth(depth, num_nodes: int) -> int:
  """Resolves the static path length D (None means N); 1 <= D <= N.

  A path through N nodes has at most N of them, and D sizes the verify program's buffers and
  loop, so a larger D only costs time and memory.
  """
  if depth is None:
    return num_nodes
  if isinstance(depth, bool) or not isinstance(depth, numbers.Integral) or depth < 1:
    raise ValueError(f"max_depth must be an int >= 1, got {depth!r}")
  if depth > num_nodes:
    raise ValueError(f"max_depth={depth} exceeds the tree's N={num_nodes} nodes; a path "
                     f"cannot be longer than the tree (use None for N)")
  return int(depth)


def tree(tree_tokens, parents, target_logits, depth, check_values: bool = True):
  """Checks a draft tree: tokens int[B, N], parents int[B, N], logits float[B, N+1, V].

  Parents must be topologically ordered: -1 (child of the root) or an index below the
  node's own. Returns (tokens int32, parents int32, logits, V, D).
  """
  toks = tokens(tree_tokens, "tree_tokens")
  b, n = toks.shape
  if n == 0:
    raise ValueError("tree_tokens has N=0 nodes; a tree needs N >= 1")
  par = tokens(parents, "parents")
  if tuple(par.shape) != (b, n):
    raise ValueError(f"parents must have shape ({b}, {n}) like tree_tokens, got "
                     f"{tuple(par.shape)}")
  z = logits(target_logits, "target_logits", (b, n + 1, None))
  d = max_depth(depth, n)
  if check_values and is_concrete(par):
    p = np.asarray(par)
    idx = np.arange(n)
    bad = (p < -1) | (p >= idx)
    if bad.any():
      row, node = map(int, np.argwhere(bad)[0])
      raise ValueError(
          f"parents[{row}, {node}] = {int(p[row, node])}: each parent must be -1 (root) or a "
          f"smaller node index (topological order)")
    node_depth = np.zeros((b, n), np.int64)
    for i in range(n):
      par_i = p[:, i]
      node_depth[:, i] = np.where(par_i < 0, 1,
                                  np.take_along_axis(node_depth, np.maximum(par_i, 0)[:, None],
                                                     1)[:, 0] + 1)
    if node_depth.max() > d:
      raise ValueError(f"the tree is {int(node_depth.max())} levels deep, more than "
                       f"max_depth={d}")
  return toks, par, z, z.shape[-1], d
