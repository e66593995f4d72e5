"""KV-cache capacity and rollback, proven with poison.

Before every target and drafter call, every cache slot from the call's first written slot on is
overwritten with poison (NaN keys, 1e6 values): a slot that is visible to a query without having
been written by that same call, i.e. an entry past a row's committed length, a stale entry a
rollback left behind, or an unused slot, would turn the output into NaN or change it. Outputs
must equal the clean run bit for bit. A second check records every slot written and proves none
lands at or past the cache capacity, with the capacity exactly what the request needs.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode, required_capacity
from asd_jax.tree_decode import asd_tree_decode
from models.kv_cache import KVCache
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

V = 61
_TARGET = random_decoder(seed=41, vocab=V, num_layers=1, hidden=32)
_TFNS, _TPARAMS = decoder_fns(_TARGET)
_DPARAMS = decoder_fns(perturbed_copy(_TARGET, 0.4, seed=5))[1]
PROMPT, LENGTHS = random_prompts(np.random.RandomState(8), 3, 9, V)


def _poison_from(cache: KVCache, start_B) -> KVCache:
  def poison(buf, value, slot_axis):
    slots = jnp.arange(buf.shape[slot_axis]).reshape([-1 if a == slot_axis else 1
                                                      for a in range(buf.ndim)])
    later = slots >= start_B.reshape(-1, 1, 1, 1)
    return jnp.where(later, jnp.asarray(value, buf.dtype), buf)

  return KVCache(k=tuple(poison(k, jnp.nan, 3) for k in cache.k),
                 v=tuple(poison(v, 1e6, 2) for v in cache.v))


def poisoning(fns, margin: int = 0):
  """`fns` whose cache is poisoned from each call's first written slot (minus margin) on."""

  def forward(params, tokens, positions, cache):
    return fns.forward(params, tokens, positions,
                       _poison_from(cache, positions.min(axis=1) - margin))

  def tree_forward(params, tokens, positions, slots, visible, cache):
    return fns.tree_forward(params, tokens, positions, slots, visible,
                            _poison_from(cache, slots.min(axis=1)))

  def init_cache(batch, capacity):
    return _poison_from(fns.init_cache(batch, capacity), jnp.zeros((batch,), jnp.int32))

  return dataclasses.replace(fns, forward=forward, tree_forward=tree_forward,
                             init_cache=init_cache, name="poisoned")


_POISONED = poisoning(_TFNS)


def test_plain_decode_never_reads_unwritten_slots():
  clean = plain_decode(_TFNS, _TPARAMS, PROMPT, LENGTHS, max_new_tokens=12)
  dirty = plain_decode(_POISONED, _TPARAMS, PROMPT, LENGTHS, max_new_tokens=12)
  assert not np.asarray(dirty.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(dirty.tokens_BxN), np.asarray(clean.tokens_BxN))
  # Power: poisoning one committed slot more is seen (the row stops on NaN logits).
  broken = plain_decode(poisoning(_TFNS, margin=1), _TPARAMS, PROMPT, LENGTHS,
                        max_new_tokens=12)
  assert np.asarray(broken.nonfinite_B).all()


@pytest.mark.parametrize("rule", ["strict", "asd"])
def test_chain_rollback_leaves_nothing_stale_visible(rule):
  kw = dict(max_new_tokens=14, rule=rule, asd_config=ASDConfig(4.0, 0.5, 2))
  clean = asd_decode(_TFNS, _TPARAMS, lm_chain_drafter(_TFNS, 3), _DPARAMS, PROMPT, LENGTHS, **kw)
  dirty = asd_decode(_POISONED, _TPARAMS, lm_chain_drafter(_POISONED, 3), _DPARAMS, PROMPT,
                     LENGTHS, **kw)
  accepted = np.asarray(clean.stats.accepted_B)
  rounds = np.asarray(clean.stats.rounds_B)
  assert (accepted < 3 * rounds).any(), "no rejection: the test would not exercise rollback"
  assert not np.asarray(dirty.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(dirty.tokens_BxN), np.asarray(clean.tokens_BxN))


def test_tree_compaction_leaves_nothing_stale_visible():
  kw = dict(max_new_tokens=12)
  shape = TreeShape(3, 2, 6)
  clean = asd_tree_decode(_TFNS, _TPARAMS, lm_tree_drafter(_TFNS, shape), _DPARAMS, PROMPT,
                          LENGTHS, **kw)
  dirty = asd_tree_decode(_POISONED, _TPARAMS, lm_tree_drafter(_POISONED, shape), _DPARAMS,
                          PROMPT, LENGTHS, **kw)
  accepted, rounds = np.asarray(clean.stats.accepted_B), np.asarray(clean.stats.rounds_B)
  assert (accepted < 3 * rounds).any(), "no rejection: the test would not exercise compaction"
  assert not np.asarray(dirty.nonfinite_B).any()
  np.testing.assert_array_equal(np.asarray(dirty.tokens_BxN), np.asarray(clean.tokens_BxN))


def recording(fns, written: list):
  """`fns` that append the highest slot each forward / tree_forward call writes."""

  def forward(params, tokens, positions, cache):
    jax.debug.callback(lambda m: written.append(int(m)), positions.max())
    return fns.forward(params, tokens, positions, cache)

  def tree_forward(params, tokens, positions, slots, visible, cache):
    jax.debug.callback(lambda m: written.append(int(m)), slots.max())
    return fns.tree_forward(params, tokens, positions, slots, visible, cache)

  return dataclasses.replace(fns, forward=forward, tree_forward=tree_forward, name="recording")


@pytest.mark.parametrize("engine", ["chain", "tree"])
def test_no_write_lands_past_capacity(engine):
  """With capacity == what the request needs, the highest slot written is below it, in the
  target's cache and the drafter's (trees: nodes in scratch slots, drafter frontiers too)."""
  if engine == "chain":
    new, lookahead = 14, 3
    decode, make_drafter = asd_decode, lambda fns: lm_chain_drafter(fns, 3)
  else:
    shape, new = TreeShape(3, 2, 6), 12
    lookahead = max(shape.num_nodes, (shape.depth - 1) * shape.top_k) + 1  # as asd_tree_decode
    decode, make_drafter = asd_tree_decode, lambda fns: lm_tree_drafter(fns, shape)
  capacity = required_capacity(PROMPT.shape[1], new, lookahead)

  def run(target, drafter, capacity):
    return decode(target, _TPARAMS, drafter, _DPARAMS, PROMPT, LENGTHS, max_new_tokens=new,
                  capacity=capacity)

  target_writes, drafter_writes = [], []
  out = run(recording(_TFNS, target_writes), make_drafter(recording(_TFNS, drafter_writes)),
            capacity)
  ref = run(_TFNS, make_drafter(_TFNS), capacity + 64)
  np.testing.assert_array_equal(np.asarray(out.tokens_BxN), np.asarray(ref.tokens_BxN))
  assert target_writes and max(target_writes) < capacity
  assert drafter_writes and max(drafter_writes) < capacity
  with pytest.raises(ValueError, match="cache slots"):
    run(_TFNS, make_drafter(_TFNS), capacity - 1)
