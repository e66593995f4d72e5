"""Chain verification rules: strict greedy, ASD with its ledger, Medusa typical acceptance.

Shapes: B rows, K draft block length, V vocabulary. Random logits sit on a 0.5 grid with few
levels, so exact ties between different ids are frequent and float32 sums are exact.
"""

import chex
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

import importlib

asd_verify_module = importlib.import_module("asd_jax.asd_verify")
greedy_verify_module = importlib.import_module("asd_jax.greedy_verify")
from asd_jax.asd_config import EXPLORATORY, PAPER, STRICT, ASDConfig
from asd_jax.asd_verify import asd_verify
from asd_jax.greedy_verify import greedy_verify
from asd_jax.typical_acceptance import typical_verify
from asd_jax.verify_output import NONFINITE_TOKEN

SHAPES = [(1, 1, 2), (3, 4, 5), (2, 7, 4), (5, 3, 3)]
EXAMPLES = settings(max_examples=60, deadline=None)


@st.composite
def blocks(draw):
  b, k, v = draw(st.sampled_from(SHAPES))
  rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
  levels = draw(st.sampled_from([2, 3, 8]))
  p_match = draw(st.sampled_from([0.0, 0.5, 0.8, 1.0]))
  z = (rng.integers(0, levels, (b, k + 1, v)) * 0.5).astype(np.float32)
  best = z.argmax(-1)[:, :k]
  draft = np.where(rng.random((b, k)) < p_match, best, rng.integers(0, v, (b, k)))
  return draft.astype(np.int32), z


configs = st.builds(
    ASDConfig,
    budget=st.sampled_from([0.0, 0.5, 1.0, 1.5, 3.0, 8.0]),
    gate=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 10.0]),
    max_exceptions=st.integers(0, 3),
    normalize_q=st.booleans(),
)


@st.composite
def ledgers(draw, b, budget):
  fractions = draw(st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0]), min_size=b, max_size=b))
  return np.asarray(fractions, np.float32) * np.float32(budget)


def reference_asd(draft, z, spent, cfg):
  """specs/asd.md, written literally: one row and one position at a time, float32."""
  b, k = draft.shape
  f32 = np.float32
  out = {n: [] for n in ("num_accepted", "next_token", "spent", "num_exceptions", "nonfinite")}
  for row in range(b):
    zr = z[row].astype(f32)
    if not np.all(np.isfinite(zr.max(-1))):
      for n, v in zip(out, (0, NONFINITE_TOKEN, spent[row], 0, True)):
        out[n].append(v)
      continue
    rem = f32(cfg.budget) - f32(spent[row])
    charged, count, a = f32(0), 0, 0
    for i in range(k):
      x = draft[row, i]
      m = x != zr[i].argmax()
      r = max(f32(0), zr[i].max() - zr[i, x])
      q = f32(k - i) / f32(k) if cfg.normalize_q else f32(k - i)
      c_i = charged + (r if m else f32(0))
      n_i = count + int(m)
      ok = ((not m or r / q <= f32(cfg.gate))
            and (not m or (c_i - r < rem and c_i <= rem))
            and n_i <= cfg.max_exceptions)
      if not ok:
        break
      charged, count, a = c_i, n_i, a + 1
    for n, v in zip(out, (a, zr[a].argmax(), spent[row] + charged, count, False)):
      out[n].append(v)
  return {n: np.asarray(v) for n, v in out.items()}


def assert_same(a, b):
  for name in a._fields:
    np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)),
                                  err_msg=name)


# --- a hand-worked example -------------------------------------------------------------------

def hand_block():
  """K=4, V=5. Position 1 is a cheap mismatch (target 2 at 2.0, draft 3 at 1.75: r_1 = 0.25),
  every other position matches; the bonus row picks 2."""
  z = np.zeros((1, 5, 5), np.float32)
  z[0, 0, 1] = 3.0                      # y*_0 = 1, draft 1: match
  z[0, 1, 2], z[0, 1, 3] = 2.0, 1.75    # y*_1 = 2, draft 3: mismatch, r_1 = 0.25
  z[0, 2, 4] = 1.0                      # y*_2 = 4, draft 4: match
  z[0, 3, 0] = 1.0                      # y*_3 = 0 (first maximum), draft 0: match
  z[0, 4, 2] = 5.0                      # bonus row: y*_4 = 2
  return np.array([[1, 3, 4, 0]], np.int32), z


def test_hand_worked_example():
  draft, z = hand_block()
  strict = greedy_verify(draft, z)
  assert int(strict.num_accepted[0]) == 1 and int(strict.next_token[0]) == 2  # recovery y*_1

  out = asd_verify(draft, z, np.zeros(1), PAPER)   # B=8, g=0.25, M=2
  # gate: r_1/q_1 = 0.25/(4-1) = 0.083 <= 0.25; budget: 0 < 8 and 0.25 <= 8; N = 1 <= 2.
  assert int(out.num_accepted[0]) == 4
  assert int(out.next_token[0]) == 2                # bonus token, not charged
  assert float(out.spent[0]) == 0.25                # exactly r_1
  assert int(out.num_exceptions[0]) == 1


@pytest.mark.parametrize("cfg, spent, accepted", [
    (ASDConfig(budget=0.25, gate=0.25, max_exceptions=1), 0.0, 4),   # C = 0.25 <= rem = 0.25
    (ASDConfig(budget=0.2, gate=0.25, max_exceptions=1), 0.0, 1),    # C = 0.25 > rem = 0.2
    (ASDConfig(budget=8.0, gate=0.25, max_exceptions=2), 7.9, 1),    # rem = 0.1 < 0.25
    (ASDConfig(budget=8.0, gate=0.08, max_exceptions=2), 0.0, 1),    # 0.25/3 > 0.08
    (ASDConfig(budget=8.0, gate=0.25, max_exceptions=2, normalize_q=True), 0.0, 1),  # 0.25/0.75
    (ASDConfig(budget=8.0, gate=0.34, max_exceptions=2, normalize_q=True), 0.0, 4),
    (ASDConfig(budget=8.0, gate=0.25, max_exceptions=0), 0.0, 1),    # cap M = 0
])
def test_hand_worked_example_each_test_of_the_rule(cfg, spent, accepted):
  draft, z = hand_block()
  out = asd_verify(draft, z, np.array([spent]), cfg)
  assert int(out.num_accepted[0]) == accepted
  assert float(out.spent[0]) == np.float32(spent) + (np.float32(0.25) if accepted == 4 else 0)


def test_exact_tie_rejected_at_budget_zero_accepted_free_with_budget():
  # Ids 1 and 3 tie at the maximum; jnp.argmax picks 1, the draft says 3: a mismatch, r = 0.
  z = np.zeros((1, 3, 4), np.float32)
  z[0, 0, [1, 3]] = 2.0
  z[0, 1, 0] = z[0, 2, 2] = 1.0
  draft = np.array([[3, 0]], np.int32)
  assert int(greedy_verify(draft, z).num_accepted[0]) == 0
  assert_same(asd_verify(draft, z, np.zeros(1), STRICT), greedy_verify(draft, z))
  assert_same(asd_verify(draft, z, np.zeros(1), ASDConfig(0.0, 10.0, 5)), greedy_verify(draft, z))
  # Exhausted ledger: the strict `<` rejects a zero-regret tie when nothing remains.
  assert int(asd_verify(draft, z, np.array([8.0]), PAPER).num_accepted[0]) == 0
  out = asd_verify(draft, z, np.zeros(1), PAPER)
  assert int(out.num_accepted[0]) == 2 and int(out.num_exceptions[0]) == 1
  assert float(out.spent[0]) == 0.0 and int(out.next_token[0]) == 2


def test_regret_is_float32_for_bf16_logits():
  # 3.0 - 0.0078125 = 2.9921875 is exact in float32 but rounds to 3.0 in bfloat16.
  z = np.zeros((1, 2, 4), np.float32)
  z[0, 0, 0], z[0, 0, 1], z[0, 0, 2:] = 3.0, 0.0078125, -1.0
  out = asd_verify(np.array([[1]]), jnp.asarray(z, jnp.bfloat16), np.zeros(1),
                   ASDConfig(budget=100.0, gate=100.0, max_exceptions=1))
  assert int(out.num_accepted[0]) == 1
  assert float(out.spent[0]) == 2.9921875


@pytest.mark.parametrize("vocab", [511, 512, 1000, 4103])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_fast_argmax_is_jnp_argmax_and_nan_is_flagged(vocab, dtype):
  # Large vocabularies take the chunked path of `first_argmax`; ties are frequent here.
  rng = np.random.default_rng(vocab)
  z = np.round(rng.normal(size=(6, 3, vocab)) * 2).astype(np.float32)
  z[1, 2, -1] = 50.0                                 # maximum in the tail
  z[2, 1, rng.integers(vocab)] = np.nan
  z[3, 0, 0] = -np.nan
  z[4, 2, -1] = np.nan
  z = jnp.asarray(z, dtype)
  best, top, nonfinite = jax.jit(greedy_verify_module.target_argmax)(z)
  clean = np.array([True, True, False, False, False, True])
  np.testing.assert_array_equal(np.asarray(best)[clean], np.asarray(jnp.argmax(z, -1))[clean])
  np.testing.assert_array_equal(np.asarray(top)[clean],
                                np.asarray(jnp.max(z, -1).astype(jnp.float32))[clean])
  np.testing.assert_array_equal(np.asarray(nonfinite), ~clean)


# --- properties --------------------------------------------------------------------------------

@EXAMPLES
@given(blocks(), st.sampled_from([0.0, 0.25, 1.0, 10.0]), st.integers(0, 3), st.booleans())
def test_budget_zero_or_cap_zero_is_strict(block, gate, cap, normalize_q):
  draft, z = block
  spent = np.zeros(draft.shape[0], np.float32)
  strict = greedy_verify(draft, z, spent)
  assert_same(asd_verify(draft, z, spent, ASDConfig(0.0, gate, cap, normalize_q)), strict)
  assert_same(asd_verify(draft, z, spent, ASDConfig(8.0, gate, 0, normalize_q)), strict)


@EXAMPLES
@given(blocks(), st.booleans())
def test_gate_zero_is_strict_except_zero_regret_ties(block, normalize_q):
  # As written, `r/q <= g` with g = 0 still admits r = 0: an exact tie with another id.
  draft, z = block
  spent = np.zeros(draft.shape[0], np.float32)
  out = asd_verify(draft, z, spent, ASDConfig(8.0, 0.0, 7, normalize_q))
  strict = np.asarray(greedy_verify(draft, z, spent).num_accepted)
  a, exceptions = np.asarray(out.num_accepted), np.asarray(out.num_exceptions)
  np.testing.assert_array_equal(np.asarray(out.spent), 0.0)
  np.testing.assert_array_equal(a[exceptions == 0], strict[exceptions == 0])
  k = draft.shape[1]
  drafted = np.take_along_axis(z[:, :k], draft[..., None], -1)[..., 0]
  inside = np.arange(k) < a[:, None]
  assert np.all(~inside | (drafted == z.max(-1)[:, :k]))


@EXAMPLES
@given(st.data())
def test_matches_literal_reference(data):
  draft, z = data.draw(blocks())
  cfg = data.draw(configs)
  spent = data.draw(ledgers(draft.shape[0], cfg.budget))
  out = asd_verify(draft, z, spent, cfg)
  ref = reference_asd(draft, z, spent, cfg)
  for name, want in ref.items():
    np.testing.assert_array_equal(np.asarray(getattr(out, name)), want, err_msg=name)


@EXAMPLES
@given(st.data())
def test_invariants(data):
  draft, z = data.draw(blocks())
  cfg = data.draw(configs)
  spent = data.draw(ledgers(draft.shape[0], cfg.budget))
  out = asd_verify(draft, z, spent, cfg)
  chex.assert_shape([out.num_accepted, out.next_token, out.spent, out.num_exceptions,
                     out.nonfinite], (draft.shape[0],))
  chex.assert_type([out.num_accepted, out.next_token, out.num_exceptions, out.spent],
                   [jnp.int32, jnp.int32, jnp.int32, jnp.float32])
  a = np.asarray(out.num_accepted)
  assert np.all((0 <= a) & (a <= draft.shape[1]))
  assert np.all(np.asarray(out.spent) >= spent)
  assert np.all(np.asarray(out.spent) <= np.float32(cfg.budget))
  assert np.all(np.asarray(out.num_exceptions) <= min(cfg.max_exceptions, draft.shape[1]))
  # next token = argmax of row a; accepted tokens that differ from argmax are the exceptions
  best = z.argmax(-1)
  np.testing.assert_array_equal(np.asarray(out.next_token), best[np.arange(len(a)), a])
  inside = np.arange(draft.shape[1]) < a[:, None]
  np.testing.assert_array_equal(np.asarray(out.num_exceptions),
                                ((draft != best[:, :-1]) & inside).sum(1))


@EXAMPLES
@given(st.data())
def test_monotone_in_budget_gate_and_cap(data):
  draft, z = data.draw(blocks())
  lo = data.draw(configs)
  hi = ASDConfig(budget=lo.budget + data.draw(st.sampled_from([0.0, 0.5, 4.0])),
                 gate=lo.gate + data.draw(st.sampled_from([0.0, 0.1, 1.0])),
                 max_exceptions=lo.max_exceptions + data.draw(st.integers(0, 2)),
                 normalize_q=lo.normalize_q)
  spent = np.zeros(draft.shape[0], np.float32)
  base = np.asarray(asd_verify(draft, z, spent, lo).num_accepted)
  for cfg in (hi, ASDConfig(hi.budget, lo.gate, lo.max_exceptions, lo.normalize_q),
              ASDConfig(lo.budget, hi.gate, lo.max_exceptions, lo.normalize_q),
              ASDConfig(lo.budget, lo.gate, hi.max_exceptions, lo.normalize_q)):
    assert np.all(np.asarray(asd_verify(draft, z, spent, cfg).num_accepted) >= base)


@EXAMPLES
@given(st.data())
def test_batched_equals_row_by_row(data):
  draft, z = data.draw(blocks())
  cfg = data.draw(configs)
  spent = data.draw(ledgers(draft.shape[0], cfg.budget))
  out = asd_verify(draft, z, spent, cfg)
  for row in range(draft.shape[0]):
    one = asd_verify(draft[row:row + 1], z[row:row + 1], spent[row:row + 1], cfg)
    for name in out._fields:
      np.testing.assert_array_equal(np.asarray(getattr(out, name))[row:row + 1],
                                    np.asarray(getattr(one, name)), err_msg=name)


@EXAMPLES
@given(blocks())
def test_bonus_and_recovery_rows_are_never_charged(block):
  draft, z = block
  b, k = draft.shape
  spent = np.zeros(b, np.float32)
  out = asd_verify(draft, z, spent, EXPLORATORY)
  a = np.asarray(out.num_accepted)
  # The charge is the regret of the accepted mismatches, nothing else.
  inside = np.arange(k) < a[:, None]
  regret = z.max(-1)[:, :k] - np.take_along_axis(z[:, :k], draft[..., None], -1)[..., 0]
  charged = np.where(inside & (draft != z.argmax(-1)[:, :k]), regret, 0).sum(1)
  np.testing.assert_array_equal(np.asarray(out.spent), charged.astype(np.float32))
  # Rewriting every row after the recovery row, and the bonus row after a full accept,
  # changes at most the committed next token.
  z2 = z.copy()
  rng = np.random.default_rng(0)
  for row, n in enumerate(a):
    start = n if n == k else n + 1
    z2[row, start:] = rng.integers(-20, 20, z2[row, start:].shape) * 0.5
  again = asd_verify(draft, z2, spent, EXPLORATORY)
  for name in ("num_accepted", "spent", "num_exceptions"):
    np.testing.assert_array_equal(np.asarray(getattr(again, name)),
                                  np.asarray(getattr(out, name)))


def test_ledger_across_rounds_is_monotone_and_then_strict():
  rng = np.random.default_rng(3)
  cfg = ASDConfig(budget=1.0, gate=1.0, max_exceptions=2)
  spent = np.zeros(4, np.float32)
  exhausted_rounds = 0
  for _ in range(30):
    z = (rng.integers(0, 3, (4, 5, 6)) * 0.5).astype(np.float32)
    draft = np.where(rng.random((4, 4)) < 0.7, z.argmax(-1)[:, :4],
                     rng.integers(0, 6, (4, 4))).astype(np.int32)
    out = asd_verify(draft, z, spent, cfg)
    new = np.asarray(out.spent)
    assert np.all(new >= spent) and np.all(new <= cfg.budget)
    done = spent >= cfg.budget
    strict = greedy_verify(draft, z)
    np.testing.assert_array_equal(np.asarray(out.num_accepted)[done],
                                  np.asarray(strict.num_accepted)[done])
    exhausted_rounds += int(done.sum())
    spent = new
  assert exhausted_rounds > 0


def test_same_shapes_never_retrace(monkeypatch):
  chex.clear_trace_counter()
  asd_core = jax.jit(chex.assert_max_traces(asd_verify_module._asd_core.__wrapped__, n=1),
                     static_argnames=("normalize_q",))
  greedy_core = jax.jit(chex.assert_max_traces(greedy_verify_module._greedy_core.__wrapped__,
                                               n=1))
  monkeypatch.setattr(asd_verify_module, "_asd_core", asd_core)
  monkeypatch.setattr(greedy_verify_module, "_greedy_core", greedy_core)
  rng = np.random.default_rng(0)
  for cfg in (PAPER, EXPLORATORY, STRICT, ASDConfig(1, 0, 1), ASDConfig(3.5, 0.1, 7)):
    z = rng.normal(size=(3, 5, 7)).astype(np.float32)
    draft = rng.integers(0, 7, (3, 4))  # int64 on the host: cast before the jit boundary
    spent = rng.uniform(0, 1, 3)         # float64 likewise
    asd_verify(draft, z, spent, cfg)
    greedy_verify(draft.astype(np.int32), jnp.asarray(z), spent)


def test_nonfinite_rows_are_flagged_not_decoded():
  draft, z = hand_block()
  draft, z = np.repeat(draft, 5, 0), np.repeat(z, 5, 0)
  z[1, 2, 3] = np.nan
  z[2, 4, 0] = np.inf
  z[3, 3, :] = -np.inf
  z[4, 1, 4] = -np.inf          # an isolated -inf (masked id) is fine
  spent = np.full(5, 0.5, np.float32)
  out = asd_verify(draft, z, spent, PAPER)
  np.testing.assert_array_equal(np.asarray(out.nonfinite), [False, True, True, True, False])
  np.testing.assert_array_equal(np.asarray(out.num_accepted), [4, 0, 0, 0, 4])
  np.testing.assert_array_equal(np.asarray(out.next_token), [2, -1, -1, -1, 2])
  np.testing.assert_array_equal(np.asarray(out.spent), [0.75, 0.5, 0.5, 0.5, 0.75])
  np.testing.assert_array_equal(np.asarray(out.num_exceptions), [1, 0, 0, 0, 1])
  assert_same(greedy_verify(draft, z, spent),
              asd_verify(draft, z, spent, STRICT))
  # A draft id whose logit is -inf has infinite regret: never accepted, never charged.
  z[4, 1, 3] = -np.inf
  out = asd_verify(draft[4:], z[4:], spent[4:], EXPLORATORY)
  assert int(out.num_accepted[0]) == 1 and float(out.spent[0]) == 0.5


def test_inside_jit_and_vmap():
  draft, z = hand_block()
  jitted = jax.jit(lambda d, zz, s: asd_verify(d, zz, s, PAPER))
  assert_same(jitted(draft, z, jnp.zeros(1)), asd_verify(draft, z, np.zeros(1), PAPER))
  # Under jit ids are not checked (no host read); an out-of-vocabulary id is never accepted.
  bad = jitted(jnp.array([[1, 7, 4, 0]]), z, jnp.zeros(1))
  assert int(bad.num_accepted[0]) == 1 and float(bad.spent[0]) == 0.0
  bad = jax.jit(greedy_verify)(jnp.array([[-5, 3, 4, 0]]), z)
  assert int(bad.num_accepted[0]) == 0
  stacked = jax.vmap(lambda d, zz, s: asd_verify(d, zz, s, PAPER))(
      jnp.stack([draft, draft]), jnp.stack([z, z]), jnp.zeros((2, 1)))
  assert stacked.num_accepted.shape == (2, 1)
  np.testing.assert_array_equal(np.asarray(stacked.num_accepted), [[4], [4]])


# --- Medusa typical acceptance ----------------------------------------------------------------

def test_typical_acceptance_hand_example():
  # Row 0 is flat (entropy log 4): threshold min(0.09, 0.3/4) = 0.075 < p = 0.25, any id passes.
  # Row 1 is peaked: the draft id has p ~ 0.0003 < threshold, rejected.
  z = np.zeros((1, 3, 4), np.float32)
  z[0, 1, 0] = 10.0
  out = typical_verify(np.array([[3, 2]]), z)
  assert int(out.num_accepted[0]) == 1 and int(out.next_token[0]) == 0
  assert int(out.num_exceptions[0]) == 1  # id 3 is not the argmax of the flat row (id 0 is)


@EXAMPLES
@given(blocks())
def test_typical_acceptance_accepts_at_least_strict(block):
  draft, z = block
  strict = np.asarray(greedy_verify(draft, z).num_accepted)
  assert np.all(np.asarray(typical_verify(draft, z).num_accepted) >= strict)
  assert np.all(np.asarray(typical_verify(draft, z, temperature=0.5).num_accepted) >= strict)
