"""Lossless speculative sampling (chain and tree) and the shared sampling filters.

The statistical tests draw 200,000 blocks in a few vectorised calls with fixed seeds, so they
are deterministic; the empirical distributions are compared with the target by total
variation (TV). At V = 16 and 200k samples, sampling noise alone gives TV ~ 0.005; the bound
is 0.012, and a sampler fed the wrong draft probabilities lands far above it.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax.greedy_verify import greedy_verify
from asd_jax.spec_sampling import (Filters, apply_sampling_filters, sample_without_draft,
                                   speculative_sample, tree_speculative_sample)
from asd_jax.tree_verify import tree_greedy_verify
from asd_jax.verify_output import NONFINITE_TOKEN

V = 16
SAMPLES = 200_000
CHUNKS = 2
TV_BOUND = 0.012
FILTERS = [dict(), dict(temperature=0.8, top_k=10, top_p=0.9),
           dict(temperature=1.2, min_p=0.1, top_p=0.95)]


def tv(samples, probs):
  freq = np.bincount(np.asarray(samples), minlength=len(probs)) / len(samples)
  return 0.5 * np.abs(freq - np.asarray(probs)).sum()


def random_logits(rng, *shape, peaked=1.0):
  return (rng.normal(size=shape) * peaked).astype(np.float32)


def sample(key, logits, filters, shape):
  return draw(key, apply_sampling_filters(logits, **filters), shape)


def draw(key, probs, shape):
  return jax.random.categorical(key, jnp.log(probs), shape=shape).astype(jnp.int32)


# --- filters -----------------------------------------------------------------------------------

def test_filters_by_hand():
  z = np.log(np.array([0.1, 0.2, 0.3, 0.4], np.float32))
  np.testing.assert_allclose(apply_sampling_filters(z), [0.1, 0.2, 0.3, 0.4], rtol=1e-6)
  np.testing.assert_allclose(apply_sampling_filters(z, top_k=2), [0, 0, 3 / 7, 4 / 7], rtol=1e-6)
  np.testing.assert_allclose(apply_sampling_filters(z, top_p=0.5), [0, 0, 3 / 7, 4 / 7],
                             rtol=1e-6)
  np.testing.assert_allclose(apply_sampling_filters(z, top_p=0.75), [0, 2 / 9, 3 / 9, 4 / 9],
                             rtol=1e-6)
  hot = np.exp(2 * z) / np.exp(2 * z).sum()
  np.testing.assert_allclose(apply_sampling_filters(z, temperature=0.5), hot, rtol=1e-5)
  np.testing.assert_array_equal(apply_sampling_filters(np.array([1.0, 3.0, 3.0]), 0.0),
                                [0, 1, 0])  # first maximum, as jnp.argmax
  # min-p keeps p >= min_p * max p, of the distribution after temperature.
  np.testing.assert_allclose(apply_sampling_filters(z, min_p=0.45), [0, 2 / 9, 3 / 9, 4 / 9],
                             rtol=1e-6)
  np.testing.assert_allclose(apply_sampling_filters(z, min_p=0.8), [0, 0, 0, 1], rtol=1e-6)
  np.testing.assert_allclose(apply_sampling_filters(z, temperature=0.5, min_p=0.5),
                             [0, 0, 9 / 25, 16 / 25], rtol=1e-5)
  # Ties at the top-k boundary are all kept.
  np.testing.assert_allclose(apply_sampling_filters(np.array([2.0, 1.0, 1.0, 0.0]), top_k=2)[3],
                             0.0)
  assert float(apply_sampling_filters(np.array([2.0, 1.0, 1.0, 0.0]), top_k=2)[2]) > 0


def reference_filters(z, temperature, top_k, top_p, min_p=0.0):
  """Sort-based filters in float64, one row at a time."""
  z = np.asarray(z, np.float64) / temperature
  if min_p > 0:  # p >= min_p * max p, on the softmax after temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    z = np.where(p >= min_p, z, -np.inf)
  if 0 < top_k < z.shape[-1]:
    kth = np.sort(z, axis=-1)[..., -top_k][..., None]
    z = np.where(z >= kth, z, -np.inf)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  if top_p < 1:
    desc = -np.sort(-p, axis=-1)
    keep = np.cumsum(desc, -1) - desc < top_p
    floor = np.where(keep, desc, np.inf).min(-1, keepdims=True)
    p = np.where(p >= floor, p, 0)
    p /= p.sum(-1, keepdims=True)
  return p


@pytest.mark.parametrize("temperature, top_k, top_p, min_p", [
    (1.0, 3, 1.0, 0.0), (0.7, 1, 1.0, 0.0), (1.3, 0, 0.8, 0.0), (0.9, 20, 0.5, 0.0),
    (1.0, 50, 0.95, 0.0), (1.0, 0, 1.0, 0.05), (0.6, 0, 0.9, 0.2), (1.5, 8, 1.0, 0.1),
    (1.0, 0, 1.0, 1.0)])
def test_filters_match_a_sort_based_reference(temperature, top_k, top_p, min_p):
  rng = np.random.default_rng(top_k + int(100 * min_p))
  z = random_logits(rng, 64, 40, peaked=2.0)
  z[:16] = np.round(z[:16])  # exact ties, also at the top-k boundary
  z[16:20, 5] = -np.inf      # masked ids
  got = apply_sampling_filters(z, temperature, top_k, top_p, min_p)
  want = reference_filters(z, temperature, top_k, top_p, min_p)
  np.testing.assert_array_equal(np.asarray(got) > 0, want > 0)
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1.0), dict(temperature=float("nan")),
                                    dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0),
                                    dict(top_p=1.5), dict(min_p=-0.1), dict(min_p=1.5),
                                    dict(min_p=float("nan")), dict(min_p="0.1")])
def test_filters_reject_bad_settings(kwargs):
  with pytest.raises(ValueError):
    apply_sampling_filters(np.zeros(4), **kwargs)


def test_a_tiny_temperature_is_the_argmax_limit():
  # z / T overflowed to inf for T = 1e-37 (softmax: NaN); shifting by the max first keeps the
  # top logit at 0 and sends the rest to -inf.
  logits = np.array([[1.0, 30.0, -5.0, 29.9], [100.0, -100.0, 50.0, 99.0]], np.float32)
  for t in (1e-30, 1e-37):
    probs = np.asarray(apply_sampling_filters(logits, temperature=t))
    np.testing.assert_array_equal(probs, np.eye(4, dtype=np.float32)[[1, 0]])
  # a tie keeps its mass split, as it does at every temperature
  np.testing.assert_allclose(
      apply_sampling_filters(np.array([[3.0, 3.0, 1.0]]), temperature=1e-30), [[0.5, 0.5, 0.0]])


# --- exactness -----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_temperature_zero_is_strict_greedy(seed):
  rng = np.random.default_rng(seed)
  b, k = 16, 4
  z = (rng.integers(0, 3, (b, k + 1, V)) * 0.5).astype(np.float32)
  zq = random_logits(rng, b, k, V)
  draft = np.where(rng.random((b, k)) < 0.7, z.argmax(-1)[:, :k], rng.integers(0, V, (b, k)))
  out = speculative_sample(draft, zq, z, jax.random.key(seed), temperature=0.0)
  strict = greedy_verify(draft, z)
  np.testing.assert_array_equal(np.asarray(out.num_accepted), np.asarray(strict.num_accepted))
  np.testing.assert_array_equal(np.asarray(out.next_token), np.asarray(strict.next_token))


@pytest.mark.parametrize("seed", range(4))
def test_tree_temperature_zero_is_tree_greedy_when_siblings_differ(seed):
  rng = np.random.default_rng(seed)
  b, n = 8, 7
  parents = np.stack([[rng.integers(-1, i) for i in range(n)] for _ in range(b)])
  tokens = np.stack([rng.permutation(V)[:n] for _ in range(b)]).astype(np.int32)
  z = random_logits(rng, b, n + 1, V)
  for row in range(b):
    for node in range(n):
      if rng.random() < 0.7:
        z[row, parents[row, node] + 1, tokens[row, node]] += 10.0
  out = tree_speculative_sample(tokens, parents, random_logits(rng, b, n, V), z,
                                jax.random.key(seed), temperature=0.0)
  strict = tree_greedy_verify(tokens, parents, z)
  for name in ("path", "num_accepted", "next_token"):
    np.testing.assert_array_equal(np.asarray(getattr(out, name)),
                                  np.asarray(getattr(strict, name)), err_msg=name)


def test_chain_as_tree_samples_the_same(filters=FILTERS[1]):
  rng = np.random.default_rng(1)
  b, k = 64, 5
  z, zq = random_logits(rng, b, k + 1, V, peaked=2.0), random_logits(rng, b, k, V, peaked=2.0)
  draft = np.asarray(sample(jax.random.key(0), zq, filters, (b, k)))
  parents = np.tile(np.arange(-1, k - 1), (b, 1))
  for seed in range(3):
    key = jax.random.key(seed)
    chain = speculative_sample(draft, zq, z, key, **filters)
    tree = tree_speculative_sample(draft, parents, zq, z, key, **filters)
    for name in chain._fields:
      np.testing.assert_array_equal(np.asarray(getattr(tree, name)),
                                    np.asarray(getattr(chain, name)), err_msg=name)
    a = np.asarray(tree.num_accepted)
    np.testing.assert_array_equal(np.asarray(tree.path),
                                  np.where(np.arange(k) < a[:, None], np.arange(k), -1))


def test_nonfinite_rows_are_flagged():
  rng = np.random.default_rng(0)
  z, zq = random_logits(rng, 3, 3, V), random_logits(rng, 3, 2, V)
  z[1, 2, 5] = np.nan
  zq[2, 0, :] = -np.inf
  out = speculative_sample(np.zeros((3, 2), np.int32), zq, z, jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out.nonfinite), [False, True, True])
  np.testing.assert_array_equal(np.asarray(out.next_token)[1:], [NONFINITE_TOKEN] * 2)
  np.testing.assert_array_equal(np.asarray(out.num_accepted)[1:], [0, 0])


# --- statistical losslessness: chain -------------------------------------------------------

def chain_setup(rng):
  """K = 2: target rows p_0, p_1, p_2 (bonus); draft rows q_i close to p_i but not equal."""
  z = random_logits(rng, 3, V, peaked=1.5)
  zq = np.log(0.6 * jax.nn.softmax(z[:2]) + 0.4 * jax.nn.softmax(random_logits(rng, 2, V, peaked=2.0)))
  return z, np.asarray(zq, np.float32)


@functools.partial(jax.jit, static_argnames=("n", "filters", "draft_length"))
def chain_chunk(key, z, zq, told, n, filters, draft_length=None):
  filters = dict(filters)
  k_draft, k_verify = jax.random.split(key)
  draft = sample(k_draft, zq, filters, (n, 2))
  lengths = None if draft_length is None else jnp.full((n,), draft_length, jnp.int32)
  out = speculative_sample(draft, jnp.broadcast_to(told, (n, 2, V)),
                           jnp.broadcast_to(z, (n, 3, V)), k_verify, draft_lengths=lengths,
                           **filters)
  return draft, out


def run_chain(z, zq, filters, key, draft_probs_logits=None, draft_length=None):
  """SAMPLES blocks with K = 2; the draft tokens are drawn from the filtered zq, the verifier
  is told `draft_probs_logits` (default zq) and `draft_length` (default all K). Returns
  (first token, second token, its validity, bonus token, its validity)."""
  told = zq if draft_probs_logits is None else draft_probs_logits
  parts = []
  for chunk in range(CHUNKS):
    draft, out = chain_chunk(jax.random.fold_in(key, chunk), z, zq, told, SAMPLES // CHUNKS,
                             tuple(filters.items()), draft_length)
    a, nxt, draft = (np.asarray(x) for x in (out.num_accepted, out.next_token, draft))
    parts.append((np.where(a >= 1, draft[:, 0], nxt), np.where(a >= 2, draft[:, 1], nxt),
                  a >= 1, nxt, a == 2))
  return tuple(np.concatenate(column) for column in zip(*parts))


@pytest.mark.parametrize("filters", FILTERS)
def test_chain_sampling_is_lossless(filters):
  z, zq = chain_setup(np.random.default_rng(7))
  p = np.asarray(apply_sampling_filters(z, **filters))
  first, second, has_second, bonus, has_bonus = run_chain(z, zq, filters, jax.random.key(11))
  assert has_second.mean() > 0.3 and has_bonus.mean() > 0.15  # enough of each to measure
  assert tv(first, p[0]) <= TV_BOUND
  assert tv(second[has_second], p[1]) <= TV_BOUND
  assert tv(bonus[has_bonus], p[2]) <= TV_BOUND


def test_chain_test_can_fail_on_a_broken_sampler():
  # Broken: the verifier is told uniform draft probabilities instead of the ones the tokens
  # were drawn from, i.e. it ignores the draft distribution.
  z, zq = chain_setup(np.random.default_rng(7))
  p = np.asarray(apply_sampling_filters(z))
  first, *_ = run_chain(z, zq, {}, jax.random.key(11),
                        draft_probs_logits=np.zeros_like(zq))
  assert tv(first, p[0]) > 5 * TV_BOUND


@pytest.mark.parametrize("draft_length", [0, 1])
def test_a_shorter_draft_is_lossless(draft_length, filters=FILTERS[1]):
  """With draft_lengths < K, positions past a row's draft are never accepted, and a row that
  accepts its whole draft samples from the target row after it, not from a residual."""
  z, zq = chain_setup(np.random.default_rng(7))
  p = np.asarray(apply_sampling_filters(z, **filters))
  first, second, has_second, _, _ = run_chain(z, zq, filters, jax.random.key(3),
                                              draft_length=draft_length)
  assert tv(first, p[0]) <= TV_BOUND
  if draft_length == 0:
    assert not has_second.any()  # the first token is always the target's own draw
  else:
    assert has_second.mean() > 0.3 and tv(second[has_second], p[1]) <= TV_BOUND


@pytest.mark.parametrize("row_keys", [True, False], ids=["key per row", "one batch key"])
def test_a_row_samples_the_same_at_every_width_that_covers_its_draft(row_keys):
  """noise_slots fixed at K: verifying only the first w >= draft_length positions gives each
  row the verdict of the full block (width 0: `sample_without_draft`). The decode engine
  relies on this to verify the batch's narrowest width under rule='sample'."""
  rng = np.random.default_rng(5)
  b, k = 48, 4
  filters = FILTERS[1]
  z, zq = random_logits(rng, b, k + 1, V, peaked=2.0), random_logits(rng, b, k, V, peaked=2.0)
  # Drafts drawn from the target, so that long prefixes are accepted too.
  draft = np.asarray(sample(jax.random.key(1), z[:, :k], filters, (b, k)))
  lengths = rng.integers(0, k + 1, size=b).astype(np.int32)
  keys = jax.random.split(jax.random.key(2), b) if row_keys else jax.random.key(2)
  full = speculative_sample(draft, zq, z, keys, draft_lengths=lengths, **filters)
  a_full, next_full = np.asarray(full.num_accepted), np.asarray(full.next_token)
  assert (a_full <= lengths).all() and len(set(a_full.tolist())) >= 3
  empty = np.asarray(sample_without_draft(jnp.asarray(z[:, 0]), keys, k, Filters.of(**filters)))
  np.testing.assert_array_equal(empty[lengths == 0], next_full[lengths == 0])
  differs_without_fixed_slots = False
  for w in range(1, k):
    covered = lengths <= w
    args = (draft[:, :w], zq[:, :w], z[:, :w + 1], keys)
    part = speculative_sample(*args, draft_lengths=np.minimum(lengths, w), noise_slots=k,
                              **filters)
    np.testing.assert_array_equal(np.asarray(part.num_accepted)[covered], a_full[covered])
    np.testing.assert_array_equal(np.asarray(part.next_token)[covered], next_full[covered])
    other = speculative_sample(*args, draft_lengths=np.minimum(lengths, w), **filters)
    differs_without_fixed_slots |= bool(
        (np.asarray(other.num_accepted)[covered] != a_full[covered]).any())
  if not row_keys:
    # Control: one batch key's uniforms drawn for [B, w] instead of [B, K] land on other rows'
    # slots. (A key per row agrees either way under JAX's default partitionable threefry;
    # noise_slots makes the guarantee independent of that setting.)
    assert differs_without_fixed_slots


@pytest.mark.parametrize("kwargs, message", [
    (dict(draft_lengths=[3, 0]), "draft_lengths must be in [0, 2], got 3"),
    (dict(draft_lengths=[-1, 0]), "draft_lengths must be in [0, 2], got -1"),
    (dict(draft_lengths=[1]), "draft_lengths must be int[2]"),
    (dict(draft_lengths=[0.5, 1.0]), "draft_lengths must be int[2]"),
    (dict(noise_slots=1), "noise_slots must be an int >= K = 2"),
])
def test_bad_draft_lengths_and_noise_slots_are_refused(kwargs, message):
  rng = np.random.default_rng(0)
  z, zq = random_logits(rng, 2, 3, V), random_logits(rng, 2, 2, V)
  with pytest.raises(ValueError) as e:
    speculative_sample(np.zeros((2, 2), np.int32), zq, z, jax.random.key(0), **kwargs)
  assert message in str(e.value)


# --- statistical losslessness: tree ----------------------------------------------------------

PARENTS = np.array([-1, -1, -1, 0, 0, 1, 1, 2, 2], np.int32)  # 3 root children, 2 each below


def tree_setup(rng):
  """A two-level target: P0 at the root, P1[y1] after y1, P2 after any second token; the
  draft: Q0 and Q1[y1], mixtures of the target with other distributions."""
  mix = lambda a, b: np.log(0.5 * jax.nn.softmax(a) + 0.5 * jax.nn.softmax(b)).astype(np.float32)
  p0, p1, p2 = random_logits(rng, V, peaked=1.5), random_logits(rng, V, V, peaked=1.5), \
      random_logits(rng, V, peaked=1.5)
  q0, q1 = mix(p0, random_logits(rng, V, peaked=2.0)), mix(p1, random_logits(rng, V, V, peaked=2.0))
  return p0, p1, p2, q0, q1


@functools.partial(jax.jit, static_argnames=("n", "filters"))
def tree_chunk(key, setup, n, filters, uniform_draft):
  filters = dict(filters)
  p0, p1, p2, q0, q1 = setup
  k_1, k_2, k_verify = jax.random.split(key, 3)
  y1 = sample(k_1, q0, filters, (n, 3))                                   # i.i.d. siblings
  q1_filtered = apply_sampling_filters(q1, **filters)
  y2 = draw(k_2, q1_filtered[y1][:, :, None, :], (n, 3, 2))               # i.i.d. under each
  tokens = jnp.concatenate([y1, y2.reshape(n, 6)], axis=1)
  target = jnp.concatenate([jnp.broadcast_to(p0, (n, 1, V)), p1[y1],
                            jnp.broadcast_to(p2, (n, 6, V))], axis=1)
  draft = jnp.concatenate([jnp.broadcast_to(q0, (n, 1, V)), q1[y1],
                           jnp.zeros((n, 5, V))], axis=1)
  draft = jnp.where(uniform_draft, 0.0, draft)
  out = tree_speculative_sample(tokens, jnp.broadcast_to(PARENTS, (n, 9)), draft, target,
                                k_verify, max_depth=2, **filters)
  return tokens, out


def run_tree(setup, filters, key, uniform_draft=False):
  """SAMPLES trees (PARENTS); returns the same columns as `run_chain`."""
  parts = []
  for chunk in range(CHUNKS):
    tokens, out = tree_chunk(jax.random.fold_in(key, chunk), tuple(map(jnp.asarray, setup)),
                             SAMPLES // CHUNKS, tuple(filters.items()), uniform_draft)
    a, nxt, path, tokens = (np.asarray(x) for x in (out.num_accepted, out.next_token, out.path,
                                                    tokens))
    rows = np.arange(len(a))
    parts.append((np.where(a >= 1, tokens[rows, path[:, 0]], nxt),
                  np.where(a >= 2, tokens[rows, path[:, 1]], nxt), a >= 1, nxt, a == 2))
  return tuple(np.concatenate(column) for column in zip(*parts))


def test_tree_sampling_is_lossless(filters=FILTERS[1]):
  setup = tree_setup(np.random.default_rng(5))
  p0, p1, p2 = (np.asarray(apply_sampling_filters(x, **filters)) for x in setup[:3])
  first, second, has_second, bonus, has_bonus = run_tree(setup, filters, jax.random.key(3))
  assert has_second.mean() > 0.3 and has_bonus.mean() > 0.15
  assert tv(first, p0) <= TV_BOUND
  # Given the first token y1, the second follows P1[y1]: compare with that mixture.
  freq_y1 = np.bincount(first[has_second], minlength=V) / has_second.sum()
  assert tv(second[has_second], freq_y1 @ p1) <= TV_BOUND
  assert tv(bonus[has_bonus], p2) <= TV_BOUND


def test_tree_test_can_fail_on_a_broken_sampler(filters=FILTERS[1]):
  setup = tree_setup(np.random.default_rng(5))
  p0 = np.asarray(apply_sampling_filters(setup[0], **filters))
  first, *_ = run_tree(setup, filters, jax.random.key(3), uniform_draft=True)
  assert tv(first, p0) > 5 * TV_BOUND
