"""The two attention orders see the same entries, and decode loops update the cache in place."""

import re

import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.asd_config import ASDConfig
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.host_calls import NO_HOST_CALL, HostCall
from asd_jax.plain_decode import _plain_decode
from asd_jax.sampling import SamplingConfig
from asd_jax.sampling_keys import row_keys
from asd_jax.spec_decode import _asd_decode, prepare_request
from models.cached_attention import attend_then_write, block_mask, write_then_attend
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder

B, KV_HEADS, GROUP, H, S = 3, 2, 3, 8, 20


def _inputs(seed: int, t: int, tree: bool):
  rng = np.random.RandomState(seed)
  normal = lambda *shape: jnp.asarray(rng.randn(*shape), jnp.float32)
  # Distinct slots per row but one repeat; one row writes partly past the cache (dropped).
  slots = np.stack([rng.permutation(S)[:t] for _ in range(B)])
  slots[-1, : max(1, t // 3)] = S + np.arange(max(1, t // 3))
  positions = np.sort(rng.randint(0, S, size=(B, t)), axis=1)
  if tree:  # arbitrary masks over slots, as a draft tree builds them
    visible = rng.rand(B, t, S) < 0.5
  else:  # chain: a query sees every slot up to its position
    visible = np.arange(S)[None, None] <= positions[:, :, None]
  k, v = normal(B, t, KV_HEADS, H), normal(B, t, KV_HEADS, H)
  if t >= 3:  # row 0 writes one slot twice, the same entry (a window clamped at position 0)
    slots[0, 1] = slots[0, 0]
    k, v = k.at[0, 1].set(k[0, 0]), v.at[0, 1].set(v[0, 0])
  slots, visible = jnp.asarray(slots), jnp.asarray(visible)
  return (normal(B, t, KV_HEADS * GROUP, H), k, v, normal(B, KV_HEADS, H, S),
          normal(B, KV_HEADS, S, H), slots, block_mask(slots, visible, S))


@pytest.mark.parametrize("t", [1, 2, 7])
@pytest.mark.parametrize("tree", [False, True])
def test_attending_before_the_write_equals_writing_first(t, tree):
  for seed in range(4):
    args = _inputs(seed * 10 + t, t, tree)
    out_a, k_a, v_a = attend_then_write(*args)
    out_b, k_b, v_b = write_then_attend(*args)
    np.testing.assert_allclose(np.asarray(out_a), np.asarray(out_b), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(k_a), np.asarray(k_b))
    np.testing.assert_array_equal(np.asarray(v_a), np.asarray(v_b))


def test_a_stale_entry_at_a_rewritten_slot_is_never_read():
  q, k, v, k_cache, v_cache, slots, mask = _inputs(3, 2, tree=False)
  mask = block_mask(slots, jnp.ones_like(mask.visible_BxTxS), S)
  out = attend_then_write(q, k, v, k_cache, v_cache, slots, mask)[0]
  rows = jnp.arange(B)[:, None]
  poisoned_k = k_cache.at[rows, :, :, jnp.clip(slots, 0, S - 1)].set(jnp.nan)
  poisoned_v = v_cache.at[rows, :, jnp.clip(slots, 0, S - 1)].set(1e6)
  # Rows 0 and 1 write both slots inside the cache; their stale entries must not matter.
  out_poisoned = attend_then_write(q, k, v, poisoned_k, poisoned_v, slots, mask)[0]
  np.testing.assert_allclose(np.asarray(out_poisoned[:2]), np.asarray(out[:2]), rtol=1e-5)


def _cache_copies_outside_entry(compiled_text: str, cache_shapes: list[str]) -> int:
  """Copies of a full KV-cache buffer anywhere but the program's entry (i.e. inside loops)."""
  pattern = "|".join(re.escape(s) for s in cache_shapes)
  copies = 0
  for computation in re.split(r"\n(?=\S)", compiled_text):
    if not computation.startswith("ENTRY"):
      copies += len(re.findall(rf"= f32\[(?:{pattern})\]\{{[0-9,]*\}} copy\(", computation))
  return copies


_MODEL = random_decoder(seed=0, vocab=61, num_layers=2)
_FNS, _PARAMS = decoder_fns(_MODEL)
_CAPACITY = 64
_SHAPES = ["1,2,16,64", "1,2,64,16"]  # keys [B, K, H, S], values [B, K, S, H]


@pytest.mark.parametrize("host_hook", [None, "stream", "stop", "logprobs", "penalties"])
def test_plain_decoding_updates_the_cache_in_place(host_hook, shipped_build):
  # A host callback in the loop (streaming, stop strings), the logprob buffer or the penalties'
  # token counts must not cost a cache copy either. Lowering only: the call id is never looked
  # up.
  host = HostCall(np.int32(1), stream=host_hook == "stream", stop=host_hook == "stop")
  sampling = SamplingConfig(repetition_penalty=1.2 if host_hook == "penalties" else 1.0)
  text = _plain_decode.lower(
      _FNS, _PARAMS, jnp.ones((1, 8), jnp.int32), jnp.array([8]), jnp.array([32]), row_keys(0, 1),
      max_new_tokens=32, capacity=_CAPACITY, eos_ids=(), sampling=sampling.filters(),
      edits=sampling.logit_edits(), host=host, logprobs=host_hook == "logprobs",
      top_logprobs=3 if host_hook == "logprobs" else 0).compile(shipped_build).as_text()
  assert _cache_copies_outside_entry(text, _SHAPES) == 0


def test_chain_speculative_decoding_updates_the_target_cache_in_place(shipped_build):
  drafter_fns, drafter_params = decoder_fns(perturbed_copy(_MODEL, 0.3, seed=2))
  drafter = lm_chain_drafter(drafter_fns, num_draft=4)
  req = prepare_request(_FNS, drafter.vocab_size, np.ones((1, 8), np.int32), np.array([8]),
                        rule="strict", asd_config=ASDConfig(8.0, 0.25, 2),
                        sampling=SamplingConfig(), eos_ids=(), max_new_tokens=32, max_new_B=None,
                        capacity=_CAPACITY, lookahead=4, what="K=4")
  text = _asd_decode.lower(_FNS, _PARAMS, drafter, drafter_params, *req.arrays, rule="strict",
                           sampling=SamplingConfig().filters(),
                           edits=SamplingConfig().logit_edits(), normalize_q=False,
                           max_new_tokens=32, capacity=_CAPACITY, eos_ids=(),
                           host=NO_HOST_CALL, logprobs=False,
                           top_logprobs=0).compile(shipped_build).as_text()
  # Target and drafter share the tiny model's shapes, so this covers both caches.
  assert _cache_copies_outside_entry(text, _SHAPES) == 0
