"""The contract between the decode engines and any language model (target or drafter).

The engines in asd_jax never import a model class (STYLE #2): they drive these pure callables
over explicit pytrees. models/ provides them for the Flax decoder; tests provide fakes.

Shape notation: B rows, T new tokens, V vocab, N requested hidden layers, D width.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp

Params = Any
Cache = Any


@dataclasses.dataclass(frozen=True, eq=False)
class LanguageModelFns:
  """Pure functions of one model. Hashes by identity, so it can be a static jit argument.

  forward(params, tokens_BxT, positions_BxT, cache) -> (logits_BxTxV f32, hidden_BxTxNxD | None, cache)
      Scores T new tokens per row at the given positions (slot == position), writing their K/V.
  prefill(params, tokens_BxT, lengths_B, cache) -> (last_logits_BxV f32, hidden_BxTxNxD | None, cache)
      Right-padded prompts: row b's tokens are tokens_BxT[b, :lengths_B[b]] at positions 0..;
      returns the logits after each row's last prompt token.
  init_cache(batch_size, capacity) -> cache
      A fresh preallocated cache with `capacity` slots per row.

  max_positions: the positions the model was trained for (its context window, e.g. an HF
      config's max_position_embeddings); a request whose prompt + max_new_tokens exceeds it is
      refused, as vLLM refuses it. None: no limit (fakes, or a model with none).

  Needed only for tree decoding (None otherwise):
  tree_forward(params, tokens_BxT, positions_BxT, slots_BxT, visible_BxTxS, cache)
      -> (logits_BxTxV f32, hidden | None, cache)
      Like forward, but token t is written to cache slot slots_BxT[b, t] (tree nodes share
      positions, so slots differ from positions) and attends to the slots visible_BxTxS marks.
  move_slots(cache, src_BxA, dst_BxA) -> cache
      Copies the entries at src slots to dst slots (all reads before writes); a dst slot
      outside the cache is a no-op. Compacts an accepted tree path into consecutive slots.

  param_shapes: (path, shape) of each array the params must have
      (`request_checks.param_shapes(params)`); the engines refuse params that differ, naming
      the first differing array. None: not checked.
  """

  forward: Callable[..., tuple[Any, Any, Cache]]
  prefill: Callable[..., tuple[Any, Any, Cache]]
  init_cache: Callable[[int, int], Cache]
  vocab_size: int
  name: str = "model"
  max_positions: int | None = None
  tree_forward: Callable[..., tuple[Any, Any, Cache]] | None = None
  move_slots: Callable[..., Cache] | None = None
  param_shapes: tuple | None = None


def check_logits(fns: LanguageModelFns, logits, want: tuple[int, ...], call: str):
  """At trace time (shapes are static): `call`'s logits must be float `want`, whose last axis
  is fns.vocab_size. A model whose head is wider than the vocabulary it declares would
  otherwise emit ids the engine's checks never allowed. Returns `logits`."""
  if tuple(logits.shape) != want or not jnp.issubdtype(logits.dtype, jnp.floating):
    raise ValueError(f"model {fns.name!r}: {call} returned logits {logits.dtype}"
                     f"{list(logits.shape)}, the engine needs float{list(want)} (vocab_size "
                     f"{fns.vocab_size})")
  return logits
