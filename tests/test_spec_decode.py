"""`asd_decode` invariants: strict == plain greedy, ASD ledger, self-draft, batching, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import spec_decode
from asd_jax.asd_config import ASDConfig
from asd_jax.drafter_api import ChainDrafter, lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from models.lm_fns import decoder_fns
from tests.fake_lm import fake_lm
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
NEAR_TIE = 1e-4
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_TFNS, _ = decoder_fns(_TARGET)
_DRAFT_FNS, _ = decoder_fns(random_decoder(seed=1, vocab=VOCAB, num_layers=1))


def _pair(seed: int, noise: float = 0.15):
  """Random target params and a drafter that agrees with it part of the time (same graph)."""
  target = random_decoder(seed=seed, vocab=VOCAB, num_layers=2)
  _, tparams = decoder_fns(target)
  _, dparams = decoder_fns(perturbed_copy(target, noise, seed=seed + 7))
  return tparams, dparams


_JITTED_FORWARD = {}


def _next_logits(tparams, prefix, width=64, fns=_TFNS):
  """Target logits after `prefix` (one full forward, padded to a fixed width: one compile)."""
  if fns not in _JITTED_FORWARD:
    _JITTED_FORWARD[fns] = jax.jit(fns.forward)
  forward = _JITTED_FORWARD[fns]
  ids = np.zeros((1, width), np.int32)
  ids[0, :len(prefix)] = prefix
  logits = forward(tparams, jnp.asarray(ids), jnp.arange(width)[None],
                   fns.init_cache(1, width))[0]
  return np.asarray(logits[0, len(prefix) - 1])


def _assert_equal_up_to_near_ties(tparams, prompt, lengths, got, want, *, fns=_TFNS,
                                  near_tie=lambda top: NEAR_TIE):
  """Each row of `got` equals `want` up to its first difference, and there the target's top-2
  margin after want's prefix is below near_tie(top logit)."""
  for b in range(prompt.shape[0]):
    g, w = np.asarray(got[b]), np.asarray(want[b])
    if np.array_equal(g, w):
      continue
    i = int(np.argmax(g != w))
    prefix = prompt[b, :lengths[b]].tolist() + w[:i].tolist()
    top2 = np.sort(_next_logits(tparams, prefix, fns=fns))[-2:]
    margin = float(top2[1] - top2[0])
    assert margin < near_tie(abs(float(top2[1]))), (
        f"row {b} differs at {i} with top-2 margin {margin} (top logit {top2[1]})")


# (batch, K) shapes; each runs 7 random target/drafter/prompt draws -> 56 cases per rule.
SHAPES = [(1, 1), (3, 2), (8, 3), (2, 4), (5, 5), (1, 6), (4, 7), (8, 8)]


@pytest.mark.parametrize("batch,k", SHAPES)
def test_strict_and_asd_budget0_equal_plain_greedy(batch, k):
  drafter = lm_chain_drafter(_TFNS, k)  # same graph as the target; params differ per case
  for case in range(7):
    rng = np.random.RandomState(100 * k + case)
    tparams, dparams = _pair(seed=10 * k + case)
    prompt, lengths = random_prompts(rng, batch, 12, VOCAB)
    want = plain_decode(_TFNS, tparams, prompt, lengths, max_new_tokens=20).tokens_BxN
    for rule, cfg in (("strict", ASDConfig(8.0, 0.25, 2)), ("asd", ASDConfig(0.0, 0.25, 2))):
      got = asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=20,
                       rule=rule, asd_config=cfg).tokens_BxN
      _assert_equal_up_to_near_ties(tparams, prompt, lengths, got, want)


# In bfloat16, a verification block of K + 1 tokens and plain decoding's one-token steps round
# their activations differently (the matmuls accumulate in different orders), so the target's
# logits along the same prefix differ by a few bfloat16 steps and strict can take the other of
# two near-tied tokens. Measured on these tiny models: 26 of 96 rows differ, every one at a
# margin under 0.9% of the top logit; 4 bfloat16 ulps (2**-6, 1.6%) is the allowance.
BF16_NEAR_TIE_REL = 2.0 ** -6


def test_bfloat16_strict_differs_from_plain_only_at_bfloat16_near_ties():
  for seed in range(3):
    target = random_decoder(seed=seed, vocab=VOCAB, num_layers=2, dtype="bfloat16")
    fns, tparams = decoder_fns(target)
    _, dparams = decoder_fns(perturbed_copy(target, 0.15, seed=seed + 7))
    prompt, lengths = random_prompts(np.random.RandomState(seed), 8, 12, VOCAB)
    want = plain_decode(fns, tparams, prompt, lengths, max_new_tokens=40).tokens_BxN
    near_tie = lambda top: BF16_NEAR_TIE_REL * max(top, 1.0)
    for k in (2, 4):
      got = asd_decode(fns, tparams, lm_chain_drafter(fns, k), dparams, prompt, lengths,
                       max_new_tokens=40).tokens_BxN
      _assert_equal_up_to_near_ties(tparams, prompt, lengths, got, want, fns=fns,
                                    near_tie=near_tie)
  # The allowance has power: ASD, which accepts mismatches on purpose, differs at wide margins.
  asd = asd_decode(fns, tparams, lm_chain_drafter(fns, 4), dparams, prompt, lengths,
                   max_new_tokens=40, rule="asd", asd_config=ASDConfig(1e6, 1.0, 8)).tokens_BxN
  with pytest.raises(AssertionError, match="top-2 margin"):
    _assert_equal_up_to_near_ties(tparams, prompt, lengths, asd, want, fns=fns,
                                  near_tie=near_tie)


def test_self_draft_accepts_every_token():
  tparams = decoder_fns(_TARGET)[1]
  prompt, lengths = random_prompts(np.random.RandomState(0), 3, 8, VOCAB)
  for k in (1, 4):
    out = asd_decode(_TFNS, tparams, lm_chain_drafter(_TFNS, k), tparams, prompt, lengths,
                     max_new_tokens=23)
    rounds = np.asarray(out.stats.rounds_B)
    accepted = np.asarray(out.stats.accepted_B)
    # Every round but the last accepts all K (the last may be cut by max_new_tokens).
    assert (accepted >= k * (rounds - 1)).all()
    assert out.num_generated_B.tolist() == [23, 23, 23]


def test_asd_ledger_bounded_and_output_strict_until_first_exception():
  budget, gate = 3.0, 0.5
  saw_exception = False
  drafter = lm_chain_drafter(_TFNS, 4)  # one object: drafters are static jit arguments
  for seed in range(4):
    tparams, dparams = _pair(seed=50 + seed, noise=0.3)
    prompt, lengths = random_prompts(np.random.RandomState(seed), 6, 10, VOCAB)
    strict = asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=24)
    out = asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=24,
                     rule="asd", asd_config=ASDConfig(budget, gate, 2))
    spent = np.asarray(out.stats.asd_spent_B)
    exceptions = np.asarray(out.stats.asd_exceptions_B)
    assert (spent <= budget).all() and (spent >= 0).all()
    assert ((spent > 0) <= (exceptions > 0)).all()
    for b in range(6):
      g, s = np.asarray(out.tokens_BxN[b]), np.asarray(strict.tokens_BxN[b])
      if np.array_equal(g, s):
        continue
      saw_exception = True
      assert exceptions[b] > 0
      # The first difference is an accepted mismatch whose regret fit the budget and gate.
      i = int(np.argmax(g != s))
      prefix = prompt[b, :lengths[b]].tolist() + g[:i].tolist()
      logits = _next_logits(tparams, prefix)
      regret = logits.max() - logits[g[i]]
      assert 0 < regret <= min(budget, gate * 4) + 1e-5
  assert saw_exception, "no ASD exception in any case; the test lost its power"


def test_rows_do_not_depend_on_the_batch():
  tparams, dparams = _pair(seed=3)
  prompt, lengths = random_prompts(np.random.RandomState(9), 5, 11, VOCAB)
  drafter = lm_chain_drafter(_TFNS, 3)
  for rule in ("strict", "asd"):
    together = asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=16,
                          rule=rule)
    for b in range(5):
      alone = asd_decode(_TFNS, tparams, drafter, dparams, prompt[b:b + 1], lengths[b:b + 1],
                         max_new_tokens=16, rule=rule)
      np.testing.assert_array_equal(alone.tokens_BxN[0], together.tokens_BxN[b])
      # Logits of different batch shapes may differ in the last float bits.
      np.testing.assert_allclose(alone.stats.asd_spent_B[0], together.stats.asd_spent_B[b],
                                 rtol=1e-5)


def test_same_shapes_do_not_retrace():
  tparams, dparams = _pair(seed=4)
  drafter = lm_chain_drafter(_TFNS, 2)
  prompt, lengths = random_prompts(np.random.RandomState(1), 2, 8, VOCAB)
  asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=8, rule="asd")
  before = spec_decode._asd_decode._cache_size()
  for seed, budget in enumerate((0.0, 2.0, 8.0)):
    prompt, lengths = random_prompts(np.random.RandomState(seed + 2), 2, 8, VOCAB)
    asd_decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=8, rule="asd",
               asd_config=ASDConfig(budget, 0.5, 2))
  assert spec_decode._asd_decode._cache_size() == before


def test_eos_inside_an_accepted_block_truncates_exactly():
  target = fake_lm(32)  # predicts token + 1; the identical drafter accepts everything
  drafter = lm_chain_drafter(fake_lm(32), 4)
  prompt = np.array([[3, 0], [10, 11]], np.int32)
  out = asd_decode(target, None, drafter, None, prompt, np.array([1, 2], np.int32),
                   max_new_tokens=12, eos_ids=(7,))
  assert out.tokens_BxN[0].tolist() == [4, 5, 6, 7] + [-1] * 8
  assert out.tokens_BxN[1].tolist() == list(range(12, 24))
  # Row 1: first token from prefill, then rounds of K + 1 = 5 tokens: 1 + 5 + 5 + 1.
  assert out.stats.rounds_B.tolist() == [1, 3]
  # tau counts only the tokens that are output: row 0's one round accepts all 4 drafts but the
  # EOS (the third) ends the answer, and row 1's last round accepts 4 with room for 1; neither
  # outputs that round's bonus token. Counting all accepted drafts gave tau 5.0 for both rows;
  # counting every round's +1 gave 4.0 for both.
  assert out.stats.accepted_B.tolist() == [3, 4 + 4 + 1]
  assert out.stats.round_tokens_B.tolist() == [3, 5 + 5 + 1]
  assert out.stats.accepted_per_position_BxK.tolist() == [[1, 1, 1, 0], [3, 2, 2, 2]]
  np.testing.assert_allclose(out.stats.tau_per_row(), [3.0, 11 / 3])
  assert out.stats.summary()["tau"] == 14 / 4


def test_tau_is_one_without_verification_rounds():
  """A row whose tokens all came from the prefill (max_new 1) or that generated nothing has
  tau 1, as plain decoding has; it was 0.0 (no rounds)."""
  target = fake_lm(32)
  drafter = lm_chain_drafter(fake_lm(32), 3)
  prompt, lengths = np.array([[3], [5], [7]], np.int32), np.array([1, 1, 1], np.int32)
  out = asd_decode(target, None, drafter, None, prompt, lengths, max_new_tokens=1)
  assert out.stats.rounds_B.tolist() == [0, 0, 0]
  assert out.stats.summary()["tau"] == 1.0
  out = asd_decode(target, None, drafter, None, prompt, lengths, max_new_tokens=6,
                   max_new_B=np.array([0, 1, 6]))
  assert out.stats.rounds_B.tolist() == [0, 0, 2]
  # Row 2: the prefill's token, then a round of K + 1 = 4 and one cut to 1 by max_new.
  np.testing.assert_allclose(out.stats.tau_per_row(), [1.0, 1.0, 2.5])
  assert out.stats.summary()["tau"] == 2.5


def test_wrong_drafter_still_gives_target_output():
  target = fake_lm(32)
  drafter = lm_chain_drafter(fake_lm(32, shift=2), 3)  # always wrong
  out = asd_decode(target, None, drafter, None, np.array([[5]]), np.array([1]),
                   max_new_tokens=6)
  assert out.tokens_BxN[0].tolist() == [6, 7, 8, 9, 10, 11]
  assert out.stats.accepted_B.tolist() == [0]


def test_nonfinite_target_logits_stop_the_row_without_emitting():
  target = fake_lm(32, nan_after_position=5)
  drafter = lm_chain_drafter(fake_lm(32, shift=2), 2)
  out = asd_decode(target, None, drafter, None, np.array([[1, 2]]), np.array([2]),
                   max_new_tokens=8)
  # Prefill (position 1) -> 3; round 1 scores positions 2..4 -> 4 (drafts rejected); round 2
  # scores positions 3..5 and position 5 is NaN: a block with any non-finite logits stops the
  # row, accepting and emitting nothing.
  assert out.tokens_BxN[0].tolist() == [3, 4, -1, -1, -1, -1, -1, -1]
  assert out.nonfinite_B.tolist() == [True]
  # Both target forwards count as rounds; only the first output a token.
  assert out.stats.rounds_B.tolist() == [2] and out.stats.round_tokens_B.tolist() == [1]
  np.testing.assert_allclose(out.stats.tau_per_row(), [0.5])


@pytest.mark.parametrize("kwargs,match", [
    ({"capacity": 32, "max_new_tokens": 28}, "cache slots"),
    ({"rule": "fuzzy"}, "unknown rule"),
    ({"drafter": "vocab"}, "vocabulary"),
    ({"lengths": np.array([0])}, "empty prompt"),
    ({"prompt": np.array([[VOCAB + 1, 2]])}, "outside the vocabulary"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": float("nan")}, "max_new_tokens"),
    ({"max_new_tokens": None}, "max_new_tokens"),
    ({"temperature": 0.7}, "greedy"),
    # Per-row limits: one per prompt row, integers, within max_new_tokens (never broadcast).
    ({"max_new_B": np.array([2, 2])}, r"max_new_B must be int\[1\]"),
    ({"max_new_B": np.array([[2]])}, r"max_new_B must be int\[1\]"),
    ({"max_new_B": np.array([2.7])}, r"max_new_B must be int\[1\]"),
    ({"max_new_B": np.array([5])}, r"max_new_B must be in \[0, 4\]"),
    # EOS ids: a sequence of integers, not read as something else.
    ({"eos_ids": "45"}, "eos_ids must be a sequence"),
    ({"eos_ids": 5}, "eos_ids must be a sequence"),
    ({"eos_ids": (4.7,)}, "eos_ids must be integer"),
    ({"eos_ids": (True,)}, "eos_ids must be integer"),
    ({"capacity": 64.5}, "capacity must be a positive integer"),
    ({"capacity": "64"}, "capacity must be a positive integer"),
    ({"drafter": "longer than the context"}, "context window"),
])
def test_bad_requests_are_refused_before_running(kwargs, match):
  from asd_jax.sampling import SamplingConfig
  tparams, dparams = _pair(seed=5)
  drafter = lm_chain_drafter(_TFNS, 2)
  which_drafter = kwargs.pop("drafter", None)
  if which_drafter == "vocab":
    small = random_decoder(seed=2, vocab=VOCAB - 1, num_layers=1)
    fns, dparams = decoder_fns(small)
    drafter = lm_chain_drafter(fns, 2)
  if which_drafter == "longer than the context":
    drafter = lm_chain_drafter(_TFNS, _TFNS.max_positions)
  args = dict(prompt=np.array([[1, 2]]), lengths=np.array([2]), max_new_tokens=4)
  args.update(kwargs)
  extra = {}
  if "temperature" in args:
    extra["sampling"] = SamplingConfig(temperature=args.pop("temperature"))
  with pytest.raises((ValueError, TypeError), match=match):
    asd_decode(_TFNS, tparams, drafter, dparams, args.pop("prompt"), args.pop("lengths"),
               **args, **extra)


def test_k_must_be_positive():
  for bad in (0, -1, 2.5, True, float("nan"), "2", None):
    with pytest.raises(ValueError, match=r"K \(draft block length\) must be a positive"):
      lm_chain_drafter(_TFNS, bad)
  assert lm_chain_drafter(_TFNS, 4.0).num_draft == 4
  with pytest.raises(ValueError, match="K"):
    ChainDrafter(prefill=None, propose=None, num_draft=-1, vocab_size=VOCAB)


def test_a_language_model_chain_round_compiles_to_no_loop_of_its_own_on_a_gpu():
  """Lowered for CUDA (no GPU needed), the chain engine with a standalone drafter holds one
  while loop, the rounds': the drafter's K - 1 autoregressive steps are unrolled."""
  from tests.lowering import chain_engine_loops
  tparams, dparams = _pair(0)
  drafter = lm_chain_drafter(_TFNS, 4)  # the drafter shares the target's graph (see _pair)
  assert chain_engine_loops(_TFNS, tparams, drafter, dparams, "cuda") == 1


def test_a_request_past_the_drafters_window_is_decoded_with_a_warning():
  """A drafter trained for fewer positions than the request reaches drafts worse there (its
  position encoding extrapolates); that costs speed, never a wrong token, so the request is
  decoded (strict output == plain) and the user is told why it may be slow."""
  import dataclasses
  import warnings

  from asd_jax.draft_tree import TreeShape, lm_tree_drafter
  from asd_jax.tree_decode import asd_tree_decode
  tparams, dparams = _pair(3)
  short = dataclasses.replace(_TFNS, max_positions=12, name="short-drafter")
  prompt = np.array([[5, 9, 2, 7, 7, 1]], np.int32)
  lengths = np.array([6], np.int32)
  plain = plain_decode(_TFNS, tparams, prompt, lengths, max_new_tokens=8)
  for decode, drafter in ((asd_decode, lm_chain_drafter(short, 3)),
                          (asd_tree_decode, lm_tree_drafter(short, TreeShape(2, 2, 3)))):
    assert drafter.max_positions == 12
    with pytest.warns(UserWarning, match="reach 14 positions, past the 12 drafter "
                      "'short-drafter' was trained for"):
      out = decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=8)
    np.testing.assert_array_equal(out.tokens_BxN, plain.tokens_BxN)
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # within the window: no warning
      decode(_TFNS, tparams, drafter, dparams, prompt, lengths, max_new_tokens=6)
  with pytest.raises(ValueError, match="max_positions must be a positive integer"):
    dataclasses.replace(lm_chain_drafter(short, 3), max_positions=0)
