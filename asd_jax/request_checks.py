"""Validation of decode requests at the Python boundary (before anything is traced).

Every failure is a ValueError/TypeError whose one-line message names the problem and the
offending value; nothing is clamped.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Iterable

import jax
import numpy as np


# Default capacities are rounded up to this many slots, so nearby request sizes share one
# compiled program.
CAPACITY_BUCKET = 64


def check_type(name: str, value, expected: type) -> None:
  """A wrong object (a dict for a config, None for the model) fails here by name, not later as
  an AttributeError deep in the engine."""
  if not isinstance(value, expected):
    raise TypeError(f"{name} must be {expected.__name__}, got {type(value).__name__}")


ParamShapes = tuple[tuple[str, tuple[int, ...]], ...]


def param_shapes(params) -> ParamShapes:
  """(path, shape) of each array of a params pytree, in pytree order: what a model's functions
  record (LanguageModelFns.param_shapes) so that params of another model are refused."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  return tuple((jax.tree_util.keystr(path), tuple(np.shape(x))) for path, x in leaves)


def check_param_shapes(what: str, params, expected: ParamShapes | None, model: str) -> None:
  """Params must have the arrays `expected` lists, shape for shape (dtypes and containers may
  differ: bfloat16 copies and pure dicts are fine). Without this, another model's params fail
  inside the model's first layer with a reshape or leaf-count error. None: not checked."""
  if expected is None:
    return
  leaves = jax.tree_util.tree_leaves(params)
  if not leaves and expected:
    raise ValueError(f"{what} are empty ({params!r}), model {model!r} needs its "
                     f"{len(expected)} arrays")
  odd = next((x for x in leaves if not hasattr(x, "shape") and not isinstance(x, numbers.Number)),
             None)
  if odd is not None:
    raise TypeError(f"{what} must be a pytree of arrays, got a {type(odd).__name__} in them")
  if len(leaves) != len(expected):
    raise ValueError(f"{what} hold {len(leaves)} arrays, model {model!r} has {len(expected)}: "
                     f"are they another model's parameters?")
  for x, (path, shape) in zip(leaves, expected):
    if tuple(np.shape(x)) != shape:
      raise ValueError(f"{what}: {path} has shape {tuple(np.shape(x))}, model {model!r} needs "
                       f"{shape}: are they another model's parameters?")


def check_prompts(prompt_BxT, lengths_B, vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Checks right-padded prompts; returns them as int32 numpy arrays."""
  try:
    prompt = np.asarray(prompt_BxT)
  except ValueError:  # numpy's "inhomogeneous shape" for rows of different lengths
    raise ValueError("prompt tokens must be a rectangular int[B, T]: right-pad the rows to one "
                     "width and give each row's length in lengths_B") from None
  lengths = np.asarray(lengths_B)
  if prompt.ndim != 2:
    raise ValueError(f"prompt tokens must be int[B, T], got shape {prompt.shape}")
  if not np.issubdtype(prompt.dtype, np.integer):
    raise TypeError(f"prompt tokens must be integers, got dtype {prompt.dtype}")
  if lengths.shape != (prompt.shape[0],) or not np.issubdtype(lengths.dtype, np.integer):
    raise ValueError(f"lengths must be int[{prompt.shape[0]}], got {lengths.dtype} {lengths.shape}")
  if prompt.shape[0] == 0:
    raise ValueError("empty batch: no prompts given")
  if (lengths <= 0).any():
    raise ValueError(f"empty prompt in row {int(np.argmax(lengths <= 0))}: every prompt needs >= 1 token")
  if (lengths > prompt.shape[1]).any():
    raise ValueError(f"lengths {lengths.tolist()} exceed the padded prompt width {prompt.shape[1]}")
  mask = np.arange(prompt.shape[1])[None, :] < lengths[:, None]
  bad = mask & ((prompt < 0) | (prompt >= vocab_size))
  if bad.any():
    b, t = map(int, np.argwhere(bad)[0])
    raise ValueError(f"token id {int(prompt[b, t])} at row {b}, position {t} is outside the "
                     f"vocabulary [0, {vocab_size})")
  return prompt.astype(np.int32), lengths.astype(np.int32)


def check_positive_int(name: str, value) -> int:
  """An integer >= 1 (an integral float such as 4.0 is taken as 4); anything else, a NaN, None,
  a string, a bool or 2.5, is refused with a message naming `name`."""
  if (isinstance(value, bool) or not isinstance(value, numbers.Real)
      or not math.isfinite(value) or int(value) != value or value <= 0):
    raise ValueError(f"{name} must be a positive integer, got {value!r}")
  return int(value)


def check_max_new_per_row(max_new_B, batch: int, max_new_tokens: int) -> np.ndarray:
  """Per-row output limits: int[batch] in [0, max_new_tokens] (default: max_new_tokens each)."""
  if max_new_B is None:
    return np.full((batch,), max_new_tokens, np.int32)
  limits = np.asarray(max_new_B)
  if limits.shape != (batch,) or not np.issubdtype(limits.dtype, np.integer):
    raise ValueError(f"max_new_B must be int[{batch}] (one limit per prompt row), got "
                     f"{limits.dtype} {limits.shape}")
  if (limits > max_new_tokens).any() or (limits < 0).any():
    raise ValueError(f"max_new_B must be in [0, {max_new_tokens}], got {limits.tolist()}")
  return limits.astype(np.int32)


def check_capacity(capacity: int, needed: int, what: str, *, window_needs: int | None = None,
                   bucket: int = 1, model: str = "") -> None:
  """Cache positions are int32 on the device: a larger capacity would overflow there.

  window_needs: the slots a request filling the model's context window needs (None: no window
  known). A capacity above the larger of that and `needed`, rounded up to the engines' bucket
  (what the default capacity can be), is refused: every extra slot is allocated for every row
  and, on the CPU, scanned by every masked attention step, so capacity=2**28 would try to
  allocate hundreds of GB instead of failing.
  """
  limit = np.iinfo(np.int32).max
  if capacity > limit:
    raise ValueError(f"capacity={capacity} exceeds the int32 range of cache slots ({limit})")
  if needed > capacity:
    raise ValueError(f"{what} needs {needed} cache slots but the cache holds {capacity}; "
                     f"shorten the prompt, lower max_new_tokens or raise the capacity")
  if window_needs is None:
    return
  usable = round_up(max(window_needs, needed), bucket)
  if capacity > usable:
    raise ValueError(f"capacity={capacity} is more than any request to {model!r} can use "
                     f"({usable} slots, from its context window); lower the capacity or leave "
                     "it unset")


def check_context(max_positions: int | None, lengths_B: np.ndarray, max_new_tokens: int,
                  model: str) -> None:
  """Refuses a request that would run past the model's context window: past the positions it
  was trained for, RoPE extrapolates and the output degrades without any error."""
  longest = int(np.max(lengths_B))
  if max_positions is not None and longest + max_new_tokens > max_positions:
    raise ValueError(f"prompt ({longest} tokens) + max_new_tokens ({max_new_tokens}) = "
                     f"{longest + max_new_tokens} exceeds the context window of {model!r} "
                     f"({max_positions} positions); shorten the prompt or lower "
                     f"max_new_tokens")


def warn_past_drafter_window(max_positions: int | None, lengths_B: np.ndarray,
                             max_new_tokens: int, drafter: str) -> None:
  """Warns when a request runs past the positions its drafter was trained for (a drafter with
  a shorter context than the target's). It is not refused: the drafts there degrade, which
  costs acceptance and speed, but every output token is still the verifier's."""
  reach = int(np.max(lengths_B)) + max_new_tokens
  if max_positions is not None and reach > max_positions:
    warnings.warn(f"prompt + max_new_tokens reach {reach} positions, past the {max_positions} "
                  f"drafter {drafter!r} was trained for: its drafts there degrade (its "
                  "position encoding extrapolates), which costs speed; the output is still "
                  "verified by the target", stacklevel=4)


def check_eos_ids(eos_ids, vocab_size: int) -> tuple[int, ...]:
  """A sequence of integer token ids; a string, a lone int, a bool or a float is refused rather
  than read as something else ('45' as (4, 5), 4.7 as 4)."""
  if isinstance(eos_ids, (str, bytes)) or not isinstance(eos_ids, Iterable):
    raise TypeError(f"eos_ids must be a sequence of token ids, got {eos_ids!r}")
  if isinstance(eos_ids, jax.Array):
    eos_ids = np.asarray(eos_ids)  # its items would be jax scalars, not Python ints
  items = eos_ids.ravel().tolist() if isinstance(eos_ids, np.ndarray) else list(eos_ids)
  bad = [e for e in items if isinstance(e, bool) or not isinstance(e, numbers.Integral)]
  if bad:
    raise TypeError(f"eos_ids must be integer token ids, got {bad[0]!r} in {eos_ids!r}")
  ids = tuple(int(e) for e in items)
  for e in ids:
    if not 0 <= e < vocab_size:
      raise ValueError(f"eos id {e} is outside the vocabulary [0, {vocab_size})")
  return ids


def _is_row_sets(eos_ids) -> bool:
  """A list whose entries are themselves sequences of ids (one per row), not ids."""
  return (isinstance(eos_ids, (list, tuple)) and len(eos_ids) > 0
          and all(isinstance(row, Iterable) and not isinstance(row, (str, bytes))
                  for row in eos_ids))


def check_row_eos_ids(eos_ids, vocab_size: int,
                      batch: int) -> tuple[tuple[int, ...], np.ndarray | None]:
  """(the ids, bool[B, E] mask or None).

  eos_ids: a sequence of ids for every row, or a list with one sequence per row (each checked
  as check_eos_ids checks one). Rows that all end at the same ids give (those ids, None): the
  program one set runs. Otherwise the ids are the union, sorted, so batches whose rows name
  the same ids in another order share one program (the union is a static shape)."""
  if not _is_row_sets(eos_ids):
    return check_eos_ids(eos_ids, vocab_size), None
  if len(eos_ids) != batch:
    raise ValueError(f"eos_ids has {len(eos_ids)} sets of ids for {batch} prompt rows; give "
                     "one per row, or one set for all")
  rows = []
  for b, row in enumerate(eos_ids):
    try:
      rows.append(check_eos_ids(row, vocab_size))
    except (TypeError, ValueError) as e:
      raise type(e)(f"eos_ids[{b}]: {e}") from None
  union = tuple(sorted({i for row in rows for i in row}))
  if all(set(row) == set(union) for row in rows):
    return rows[0], None
  return union, np.array([[i in row for i in union] for row in rows], bool).reshape(
      batch, len(union))


def check_request_tokens(fns, prompt_BxT, lengths_B, *, max_new_tokens, eos_ids, max_new_B):
  """The checks every decode engine makes on a request's tokens and limits, against the
  target's functions `fns` (vocab_size, max_positions, name).

  Returns (prompt int32[B, T], lengths int32[B], max_new_tokens, eos_ids, eos_rows_BxE,
  max_new_B int32[B]): eos_ids the union of the rows' ids, eos_rows_BxE which of them ends each
  row (None: every row ends at all of them; check_row_eos_ids).
  """
  prompt, lengths = check_prompts(prompt_BxT, lengths_B, fns.vocab_size)
  max_new_tokens = check_positive_int("max_new_tokens", max_new_tokens)
  check_context(fns.max_positions, lengths, max_new_tokens, fns.name)
  eos_ids, eos_rows_BxE = check_row_eos_ids(eos_ids, fns.vocab_size, prompt.shape[0])
  max_new_B = check_max_new_per_row(max_new_B, prompt.shape[0], max_new_tokens)
  return prompt, lengths, max_new_tokens, eos_ids, eos_rows_BxE, max_new_B


def resolve_capacity(capacity, needed: int, what: str, *, window_needs: int | None,
                     model: str) -> int:
  """The KV-cache slots per row: `capacity` as given, or `needed` rounded up to
  CAPACITY_BUCKET; checked by check_capacity either way."""
  if capacity is None:
    capacity = round_up(needed, CAPACITY_BUCKET)
  capacity = check_positive_int("capacity", capacity)
  check_capacity(capacity, needed, what, window_needs=window_needs, bucket=CAPACITY_BUCKET,
                 model=model)
  return capacity


def round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple
