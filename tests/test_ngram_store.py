"""The n-gram store (the n-gram drafter's fallback): its table against a plain-Python
reference, the in-loop lookup, hash collisions, saving/loading, and the engine with it."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import asd_jax.ngram_store as ngram_store
from asd_jax.ngram_drafter import ngram_drafter, parse_ngram_name, uses_store
from asd_jax.ngram_store import (MAX_CONTINUATION, MAX_N, StoreError, build_store, fnv_hash,
                                 load_store, save_store, store_draft)
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from models.lm_fns import decoder_fns
from tests.fake_lm import fake_lm
from tests.test_spec_decode import _assert_equal_up_to_near_ties as assert_equal_up_to_near_ties
from tests.tiny_models import random_decoder, random_prompts


def reference_continuation(sequences, gram):
  """The rule in plain Python: the most frequent next token after `gram` (ties: the one whose
  latest occurrence is latest), then the rest of its latest occurrence, within its sequence."""
  n = len(gram)
  occurrences = []  # (order in the stream, sequence, end index)
  order = 0
  for s, seq in enumerate(sequences):
    for e in range(n - 1, len(seq) - 1):
      if list(seq[e - n + 1:e + 1]) == list(gram):
        occurrences.append((order + e, s, e))
    order += len(seq) + 1
  if not occurrences:
    return None
  by_next = {}
  for o in occurrences:
    by_next.setdefault(sequences[o[1]][o[2] + 1], []).append(o)
  best = max(by_next.values(), key=lambda group: (len(group), max(group)))
  _, s, e = max(best)
  return list(sequences[s][e + 1:e + 1 + MAX_CONTINUATION])


def reference_draft(sequences, history, k, min_n, max_n):
  for n in range(max_n, min_n - 1, -1):
    if len(history) < n:
      continue
    cont = reference_continuation(sequences, history[-n:])
    if cont is not None:
      return (cont + [cont[-1]] * k)[:k], n
  return None, 0


def _draft(store, history, k):
  hist = np.zeros((1, len(history) + 4), np.int32)
  hist[0, :len(history)] = history
  draft, matched = store_draft(store.tables, hist, np.array([len(history)], np.int32), k)
  return np.asarray(draft)[0].tolist(), int(matched[0])


def test_hand_built_store():
  seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [1, 2, 3, 9, 7], [6, 1, 2]]
  store = build_store(seqs, vocab_size=10, min_n=2, max_n=3)
  # (1, 2, 3) is followed by 9 twice and by 4 once: 9, then the latest occurrence's rest (7).
  assert _draft(store, [8, 1, 2, 3], 3) == ([9, 7, 7], 3)
  # (6, 1, 2) ends its sequence: not stored; the bigram (1, 2) is (next token 3, 3 times).
  assert _draft(store, [6, 1, 2], 2) == ([3, 9], 2)
  # Nothing crosses a sequence end: (5, 1) never occurs inside one sequence.
  assert _draft(store, [4, 5, 1], 2)[1] == 0
  assert _draft(store, [0], 2)[1] == 0  # shorter than every n
  assert store.entries == sum(len(t["hashes"]) for t in store.tables.values())


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=12), min_size=1, max_size=5),
       st.lists(st.integers(0, 4), min_size=1, max_size=8), st.integers(1, 10),
       st.integers(1, 2), st.integers(0, 2))
def test_lookup_matches_the_reference(seqs, history, k, min_n, extra):
  max_n = min_n + extra
  store = build_store(seqs, vocab_size=5, min_n=min_n, max_n=max_n)
  want, n = reference_draft(seqs, history, k, min_n, max_n)
  got, got_n = _draft(store, history, k)
  assert got_n == n  # the matched suffix length too: it sets how much of the draft is verified
  if n:
    assert got == want


def test_jax_hash_equals_numpy_hash():
  grams = np.random.RandomState(0).randint(0, 49152, (50, 4))
  import jax.numpy as jnp
  assert (np.asarray(ngram_store._fnv_hash_jax(jnp.asarray(grams, jnp.int32)))
          == fnv_hash(grams)).all()


def test_every_platforms_search_method_finds_numpys_indices():
  """SEARCH_METHODS: the CPU's scan and the accelerators' unrolled search give numpy's
  insertion points on a store's hash table, for stored hashes, absent ones and the extremes."""
  import jax.numpy as jnp
  rng = np.random.RandomState(0)
  store = build_store([rng.randint(0, 500, 300).tolist() for _ in range(20)], 500, 2, 4)
  hashes = store.tables[3]["hashes"]
  queries = np.concatenate([hashes[::7], rng.randint(0, 2**32, 200, dtype=np.uint64),
                            [0, 2**32 - 1]]).astype(np.uint32)
  expected = np.searchsorted(hashes, queries)
  for method in set(ngram_store.SEARCH_METHODS.values()):
    got = jnp.searchsorted(jnp.asarray(hashes), jnp.asarray(queries), method=method)
    np.testing.assert_array_equal(np.asarray(got), expected, err_msg=method)


def test_a_store_round_compiles_to_no_loop_of_its_own_on_a_gpu():
  """Lowered for CUDA (no GPU needed), the chain engine with a store drafter holds one while
  loop, the rounds': neither the store's table search nor the choice of verification width
  loops inside a round, where on a GPU every loop step costs kernel launches and a read of its
  condition. Lowered for the CPU the store keeps its binary-search loops (SEARCH_METHODS)."""
  from tests.lowering import chain_engine_loops
  fns = fake_lm(vocab_size=16)
  store = build_store([list(range(16))], vocab_size=16, min_n=2, max_n=4)
  drafter = ngram_drafter(3, 16, store=store)

  def loops(platform):
    return chain_engine_loops(fns, None, drafter, store.tables, platform)

  assert loops("cuda") == 1
  assert loops("cpu") > 1


def test_a_hash_collision_never_returns_another_ngrams_continuation(monkeypatch):
  # Every bigram starting with an even token hashes alike: (2, 1) x2 wins the slot over (4, 1).
  monkeypatch.setattr(ngram_store, "fnv_hash", lambda g: (g[..., 0] % 2).astype(np.uint32))
  monkeypatch.setattr(ngram_store, "_fnv_hash_jax", lambda g: (g[..., 0] % 2).astype("uint32"))
  store = build_store([[2, 1, 5], [2, 1, 5], [4, 1, 6]], vocab_size=8, min_n=2, max_n=2)
  assert _draft(store, [2, 1], 2) == ([5, 5], 2)
  assert _draft(store, [4, 1], 2)[1] == 0  # its slot holds (2, 1): exact check refuses


def test_save_load_and_refusals(tmp_path):
  seqs = [[1, 2, 3, 4], [2, 3, 5]]
  store = save_store(seqs, 10, tmp_path / "s", {"target": "toy"}, min_n=2, max_n=3)
  loaded = load_store(tmp_path / "s", 10)
  for n in store.tables:
    for key in store.tables[n]:
      assert np.array_equal(store.tables[n][key], loaded.tables[n][key])
  with pytest.raises(StoreError, match="vocabulary of 10 tokens .*'toy'.* has 12"):
    load_store(tmp_path / "s", 12)
  with pytest.raises(StoreError, match="cannot read"):
    load_store(tmp_path / "missing", 10)
  with pytest.raises(ValueError, match=r"token ids must be in \[0, 4\)"):
    build_store(seqs, vocab_size=4)
  with pytest.raises(ValueError, match="non-empty"):
    build_store([[]], vocab_size=4)
  with pytest.raises(ValueError, match="vocabulary of 10 tokens, the target has 12"):
    ngram_drafter(2, 12, store=store)


def test_ngram_sizes_past_what_the_drafter_uses_are_refused(tmp_path):
  # max_n = 10**6 ran for hours: the build loops over every n, stacking n columns each time.
  with pytest.raises(ValueError, match=f"max_n 1000000 is above {MAX_N}"):
    build_store([[1, 2, 3]], vocab_size=4, max_n=10**6)
  assert build_store([list(range(12))], 12, min_n=2, max_n=MAX_N).tables.keys() == set(
      range(2, MAX_N + 1))
  # A manifest edited by hand fails the same way, naming the store.
  save_store([[1, 2, 3]], 4, tmp_path / "s", {"target": "toy"})
  manifest = tmp_path / "s" / ngram_store.MANIFEST_FILE
  manifest.write_text(manifest.read_text().replace('"max_n": 4', '"max_n": 1000000'))
  with pytest.raises(StoreError, match=f"n-gram store .*s: max_n 1000000 is above {MAX_N}"):
    load_store(tmp_path / "s", 4)


def test_names():
  assert parse_ngram_name("ngram+store") == (2, 3) and uses_store("ngram+store")
  assert parse_ngram_name("ngram:1-4+store") == (1, 4) and uses_store("ngram:1-4+store")
  assert not uses_store("ngram:4") and not uses_store("eagle3+store")
  with pytest.raises(ValueError, match="optionally with '\\+store'"):
    parse_ngram_name("ngram:x+store")


def test_setup_finds_the_shipped_store_by_target_name_and_refuses_unknown_targets():
  from models.drafter_setup import setup_drafter
  from models.load import LoadedModel
  model = random_decoder(seed=0, vocab=61, num_layers=1)
  loaded = LoadedModel(cfg=model.cfg, model=model, hf_config={}, source="test")
  with pytest.raises(StoreError, match="no n-gram store for target 'toy'.*build_ngram_store"):
    setup_drafter("ngram+store", loaded, k=3, target_name="toy")
  # The shipped SmolLM2 store is for a 49152-token vocabulary, not this 61-token target.
  with pytest.raises(StoreError, match="vocabulary of 49152"):
    setup_drafter("ngram+store", loaded, k=3, target_name="smollm2-135m")


@pytest.mark.parametrize("max_n,verified,rounds", [(3, 2, 4), (4, 3, 3)])
def test_store_rounds_verify_n_minus_1_tokens_and_accept_them(max_n, verified, rounds):
  # The fake target counts modulo 16. The store holds the counting text, the prompt does not
  # repeat, so every draft comes from the store and all of it is right. A stored match of n
  # tokens is worth verifying n - 1 of the K = 3 draft tokens: with 3-grams at most 2 per
  # round, with 4-grams all 3.
  fns = fake_lm(vocab_size=16)
  store = build_store([list(range(16))], vocab_size=16, min_n=2, max_n=max_n)
  k = 3
  drafter = ngram_drafter(k, 16, store=store)
  assert drafter.widths == tuple(range(1, max_n)) + ((k,) if max_n - 1 < k else ())
  prompt = np.array([[0, 1, 2]], np.int32)
  out = asd_decode(fns, None, drafter, store.tables, prompt, np.array([3], np.int32),
                   max_new_tokens=12)
  assert np.asarray(out.tokens_BxN)[0].tolist() == [3 + i for i in range(12)]
  # The prefill's token, then rounds of `verified` accepted + 1 target token for the other 11.
  assert int(out.stats.rounds_B[0]) == rounds
  per_position = np.asarray(out.stats.accepted_per_position_BxK)[0]
  assert (per_position[:verified] == rounds).all()
  assert (per_position[verified:] == 0).all()  # never verified, so never accepted
  without = asd_decode(fns, None, ngram_drafter(k, 16), None, prompt, np.array([3], np.int32),
                       max_new_tokens=12)
  assert int(without.stats.accepted_B[0]) == 0  # control: nothing repeats in the request


@pytest.mark.parametrize("batch,k", [(1, 2), (3, 4)])
def test_strict_with_a_store_equals_plain_greedy(batch, k):
  vocab = 61
  fns, params = decoder_fns(random_decoder(seed=k, vocab=vocab, num_layers=2))
  rng = np.random.RandomState(k)
  prompt, lengths = random_prompts(rng, batch, 16, 5)
  want = plain_decode(fns, params, prompt, lengths, max_new_tokens=30).tokens_BxN
  # The store: the target's own greedy answers to other prompts (what it tends to write).
  other, other_len = random_prompts(np.random.RandomState(100 + k), 6, 16, 5)
  answers = np.asarray(plain_decode(fns, params, other, other_len, max_new_tokens=30).tokens_BxN)
  store = build_store([list(a) for a in answers], vocab, min_n=2, max_n=4)
  got = asd_decode(fns, params, ngram_drafter(k, vocab, store=store), store.tables, prompt,
                   lengths, max_new_tokens=30)
  assert_equal_up_to_near_ties(params, prompt, lengths, got.tokens_BxN, want)
  plain_ngram = asd_decode(fns, params, ngram_drafter(k, vocab), None, prompt, lengths,
                           max_new_tokens=30)
  # The store only adds drafts where the request's own tokens had none.
  assert (int(np.asarray(got.stats.accepted_B).sum())
          >= int(np.asarray(plain_ngram.stats.accepted_B).sum()))


def test_lossless_sampling_with_store_widths():
  """rule='sample' stays lossless when rounds verify fewer than K tokens: with a bigram store
  (min_n = max_n = 2) every stored match asks for 1 of the K = 3 tokens, and in the first
  round no row's own tokens can match (the prompt has no repeated bigram), so all 50,000 rows
  verify width 1 there; later rounds mix widths 1 and 3."""
  from asd_jax.sampling import SamplingConfig
  from tests import test_spec_decode_sampling as sampling_check
  v = sampling_check.V
  tfns, tparams = decoder_fns(random_decoder(seed=11, vocab=v, num_layers=2, hidden=32))
  sampling = SamplingConfig(temperature=1.0)
  rng = np.random.RandomState(5)
  store = build_store([rng.randint(0, v, 40).tolist() for _ in range(8)], v, min_n=2, max_n=2)
  drafter = ngram_drafter(3, v, store=store)
  assert drafter.widths == (1, 3)
  exact = sampling_check._exact_joint(tfns, tparams, sampling)
  got = sampling_check._sampled_joint(tfns, tparams, drafter, store.tables, sampling, seed0=3)
  tv = sampling_check._tv
  assert tv(got.sum(axis=2), exact.sum(axis=2)) <= sampling_check.TV_LIMIT
  assert tv(got.sum(axis=0), exact.sum(axis=0)) <= sampling_check.TV_LIMIT


def test_save_store_replaces_only_an_earlier_store(tmp_path):
  save_store([[1, 2, 3]], 4, tmp_path / "s", {"target": "toy"})
  save_store([[3, 2, 1]], 4, tmp_path / "s", {"target": "toy"})  # an earlier store: fine
  assert load_store(tmp_path / "s", 4).source_tokens == 3
  drafter = tmp_path / "d"
  drafter.mkdir()
  (drafter / "manifest.json").write_text('{"steps": 10}')  # a drafter's training provenance
  with pytest.raises(StoreError, match="not an n-gram store's"):
    save_store([[1, 2, 3]], 4, drafter, {"target": "toy"})
  (drafter / "config.json").write_text("{}")
  with pytest.raises(StoreError, match="holds config.json"):
    save_store([[1, 2, 3]], 4, drafter, {"target": "toy"})
  assert sorted(p.name for p in drafter.iterdir()) == ["config.json", "manifest.json"]
  assert (drafter / "manifest.json").read_text() == '{"steps": 10}'


@pytest.mark.parametrize("params,error,match", [
    (None, ValueError, r"drafter_params are empty \(None\), model 'ngram2-3\+store' needs"),
    ("store", TypeError, "must be a pytree of arrays, got a NgramStore in them"),
    ("other store", ValueError, "are they another model's parameters"),
])
def test_a_store_drafter_refuses_params_that_are_not_its_tables(params, error, match):
  """These failed while tracing: None as "'NoneType' object is not iterable", the store object
  as JAX's "Error interpreting argument"; another store's tables ran with this store's widths."""
  store = build_store([list(range(16))], vocab_size=16, min_n=2, max_n=3)
  other = build_store([list(range(16)) * 2 + [5, 5]], vocab_size=16, min_n=2, max_n=3)
  params = {"store": store, "other store": other.tables}.get(params, params)
  with pytest.raises(error, match=match):
    asd_decode(fake_lm(vocab_size=16), None, ngram_drafter(3, 16, store=store), params,
               np.array([[0, 1, 2]], np.int32), np.array([3], np.int32), max_new_tokens=4)
