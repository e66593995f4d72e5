"""Bad words (asd_jax/bad_words.py; vLLM's bad_words) in every engine.

By-hand values at each logits row of a chain round; the tail of the answer against a Python
list; plain decoding against a float64 reference loop, and no answer holds a bad word; strict
chain, n-gram, tree and tree-ASD-at-budget-0 decoding equal plain decoding (the check fails when
a round's rows ignore their drafted context); the target drafting for itself accepts every
draft; sampled answers (plain and speculative) never hold one; a row decodes as it would alone
beside rows with other words or none; other words of the same bucket reuse the program; bad
values are refused before anything runs; the tokenizer's two forms of a word.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import (SamplingConfig, TreeShape, asd_decode, asd_tree_decode, lm_chain_drafter,
                     lm_tree_drafter, plain_decode)
from asd_jax import bad_words, logit_edits
from asd_jax.ngram_drafter import ngram_drafter
from tests.test_logit_edits import _engines as strict_engines, engines_ignoring_drafted_context
from tests.test_penalties import _DRAFT_PARAMS, _FNS, _LENGTHS, _PARAMS, _PROMPT, VOCAB

MAX_NEW = 24


def _greedy(**kw):
  out = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW, **kw)
  return np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)


_FREE = _greedy()[0]
# Words the free greedy answers hold, so banning them changes two or three rows each: first
# tokens (one token, banned everywhere), a pair and a triple from inside the answers, a pair
# that starts an answer.
WORD_SETS = [
    ((int(_FREE[0, 0]),), (int(_FREE[1, 0]),)),
    (tuple(_FREE[1, 3:5].tolist()), tuple(_FREE[2, 6:9].tolist())),
    (tuple(_FREE[0, 0:2].tolist()), tuple(_FREE[1, 8:10].tolist()), (int(_FREE[2, 2]),),
     tuple(_FREE[2, 10:14].tolist())),
]


def holds(answer, word) -> bool:
  return any(tuple(answer[i:i + len(word)]) == tuple(word)
             for i in range(len(answer) - len(word) + 1))


def reference_step(z, output, words):
  """float64 logits with every token that would complete a word set to -inf."""
  z = np.array(z, np.float64)
  for word in words:
    if len(word) == 1 or tuple(output[len(output) - len(word) + 1:]) == tuple(word[:-1]):
      if len(word) - 1 <= len(output):
        z[word[-1]] = -np.inf
  return z


def test_by_hand_at_each_logits_row_of_a_chain_round():
  """Answer so far [4, 1]; drafted [2, 0, 2]. Words (1, 2), (2, 0, 3), (3,), (4, 1, 0): logits
  row j sees the answer plus draft[:j]."""
  edits = logit_edits.LogitEdits.of(bad_words_ids=[(1, 2), (2, 0, 3), (3,), (4, 1, 0)],
                                    vocab_size=6)
  assert edits.bad_prefix_NxW.shape == (4, 2) and edits.tail_width == 2
  counts = logit_edits.add_output(
      logit_edits.count_prompt(jnp.array([[5, 5]]), jnp.array([2]), 6, edits),
      jnp.array([[4, 1, 9]]), jnp.array([[True, True, False]]))
  np.testing.assert_array_equal(np.asarray(counts.tail_BxW), [[4, 1]])
  z = jnp.array([[[1.0, 2.0, 3.0, 4.0, 5.0, jnp.nan]] * 4])
  got = np.asarray(logit_edits.edit_logits(z, counts, edits,
                                           logit_edits.chain_context(jnp.array([[2, 0, 2]]))))
  banned = {0: {2, 3, 0},  # ... 4, 1: (1, 2) and (4, 1, 0) end here; (3,) everywhere
            1: {3},  # ... 1, 2
            2: {3},  # ... 2, 0: (2, 0, 3)
            3: {3}}  # ... 0, 2
  for r, ids in banned.items():
    want = [-np.inf if t in ids else float(t + 1) for t in range(5)]
    np.testing.assert_array_equal(got[0, r, :5], want, err_msg=f"logits row {r}")
    assert np.isnan(got[0, r, 5])  # a NaN passes, for the engines' NaN check
  # The prompt does not count (as vLLM): a fresh answer after a prompt ending in 1 may say 2.
  fresh = logit_edits.count_prompt(jnp.array([[4, 1]]), jnp.array([2]), 6, edits)
  got = np.asarray(logit_edits.edit_logits(z[:, 0], fresh, edits))
  assert np.isfinite(got[0, [0, 1, 2, 4]]).all() and got[0, 3] == -np.inf


def test_the_tail_follows_the_answer():
  """tail_BxW is the answer's last W tokens (-1 before it), across commits of any length."""
  edits = logit_edits.LogitEdits.of(bad_words_ids=[(1, 2, 3, 4, 5)], vocab_size=VOCAB)
  rng = np.random.default_rng(0)
  counts = logit_edits.count_prompt(jnp.zeros((3, 1), jnp.int32), jnp.ones(3, jnp.int32), VOCAB,
                                    edits)
  answers = [[], [], []]
  for _ in range(12):
    block = rng.integers(0, VOCAB, (3, 5))
    kept = rng.integers(0, 6, 3)
    counts = logit_edits.add_output(counts, jnp.asarray(block),
                                    jnp.arange(5)[None] < jnp.asarray(kept)[:, None])
    for b in range(3):
      answers[b] += block[b, :kept[b]].tolist()
      want = ([-1] * 4 + answers[b])[-4:]
      assert np.asarray(counts.tail_BxW[b]).tolist() == want


@pytest.mark.parametrize("words", WORD_SETS)
def test_plain_decoding_follows_the_reference_loop(words):
  tokens, n = _greedy(sampling=SamplingConfig(bad_words_ids=words))
  forward = jax.jit(_FNS.forward)
  for b, length in enumerate(_LENGTHS):
    ids = _PROMPT[b, :length].tolist()
    while len(ids) - length < MAX_NEW:
      logits = forward(_PARAMS, jnp.asarray([ids]), jnp.arange(len(ids))[None],
                       _FNS.init_cache(1, 64))[0][0, -1]
      ids.append(int(np.argmax(reference_step(logits, ids[length:], words))))
    assert tokens[b, :n[b]].tolist() == ids[length:], (b, words)
    assert not any(holds(ids[length:], word) for word in words)
  assert (tokens != _FREE).any(axis=1).sum() >= 2  # the words matter


@pytest.mark.parametrize("engine", ["chain K=4", "ngram K=4", "tree 4,3,12", "tree asd B=0"])
def test_strict_speculative_decoding_equals_plain_decoding(engine):
  decode = strict_engines(())[engine]
  for words in WORD_SETS:
    sampling = SamplingConfig(bad_words_ids=words)
    want = _greedy(sampling=sampling)
    got = decode(sampling)
    np.testing.assert_array_equal(np.asarray(got.tokens_BxN), want[0], err_msg=f"{words}")
    np.testing.assert_array_equal(np.asarray(got.num_generated_B), want[1])


def test_the_equality_check_fails_when_rows_ignore_their_drafted_context(monkeypatch):
  """Rounds whose rows match the words against the committed answer only (not draft[:j], not
  the node's path) let a drafted word through where plain decoding bans it: the control. (The
  target drafts for itself, so its drafts hold the free answers' words.)"""
  for name, decode in engines_ignoring_drafted_context(monkeypatch, ()).items():
    failures = sum(not np.array_equal(np.asarray(decode(SamplingConfig(
        bad_words_ids=words)).tokens_BxN), _greedy(sampling=SamplingConfig(
            bad_words_ids=words))[0]) for words in WORD_SETS[1:])
    assert failures >= 1, name


def test_the_target_drafting_for_itself_accepts_every_draft():
  """The chain and tree drafters ban the words as the target does (they read the same tail and
  add their own drafts, a tree node's path, to it): every round but a row's last accepts all K
  drafts, or the top-1 tree's whole depth."""
  k = 4
  for words in WORD_SETS:
    sampling = SamplingConfig(bad_words_ids=words)
    for out in (asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, k), _PARAMS, _PROMPT,
                           _LENGTHS, max_new_tokens=MAX_NEW, sampling=sampling),
                asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, TreeShape(k, 1, k)),
                                _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                                sampling=sampling)):
      rounds, accepted = np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)
      assert (accepted >= (rounds - 1) * k).all(), (words, rounds, accepted)


def test_sampled_answers_never_hold_a_bad_word():
  """At T = 1.5, 64 samples of one prompt: without the words many answers hold them (the
  premise); with them, none does (plain decoding and chain speculative sampling)."""
  prompt, lengths = np.tile(_PROMPT[:1], (64, 1)), np.tile(_LENGTHS[:1], 64)
  common = dict(max_new_tokens=16, seed=np.arange(64))
  free = np.asarray(plain_decode(_FNS, _PARAMS, prompt, lengths,
                                 sampling=SamplingConfig(temperature=1.5), **common).tokens_BxN)
  # The commonest pairs of the free samples, and their commonest token.
  pairs = {}
  for row in free:
    for pair in zip(row[:-1].tolist(), row[1:].tolist()):
      pairs[pair] = pairs.get(pair, 0) + 1
  words = tuple(sorted(pairs, key=pairs.get)[-6:]) + ((int(np.bincount(free.ravel()).argmax()),),)
  assert sum(any(holds(row.tolist(), w) for w in words) for row in free) >= 16
  sampling = SamplingConfig(temperature=1.5, bad_words_ids=words)
  for out in (plain_decode(_FNS, _PARAMS, prompt, lengths, sampling=sampling, **common),
              asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 3), _DRAFT_PARAMS, prompt,
                         lengths, rule="sample", sampling=sampling, **common),
              asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, TreeShape(3, 2, 6)),
                              _DRAFT_PARAMS, prompt, lengths, rule="sample", sampling=sampling,
                              **common)):
    for row in np.asarray(out.tokens_BxN):
      assert not any(holds(row.tolist(), w) for w in words), row


def test_a_row_decodes_as_it_would_alone_beside_other_words():
  """One SamplingConfig per row: words of other lengths, or none, in one batch (padded to the
  widest row's words); each row's answer is the one it gets alone."""
  rows = [SamplingConfig(bad_words_ids=WORD_SETS[2]), SamplingConfig(),
          SamplingConfig(bad_words_ids=WORD_SETS[1], repetition_penalty=1.2)]
  for decode in (lambda s, p, n: plain_decode(_FNS, _PARAMS, p, n, max_new_tokens=MAX_NEW,
                                              sampling=s),
                 lambda s, p, n: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 4),
                                            _DRAFT_PARAMS, p, n, max_new_tokens=MAX_NEW,
                                            sampling=s)):
    together = np.asarray(decode(rows, _PROMPT, _LENGTHS).tokens_BxN)
    for b, row in enumerate(rows):
      alone = np.asarray(decode(row, _PROMPT[b:b + 1, :_LENGTHS[b]], _LENGTHS[b:b + 1]).tokens_BxN)
      np.testing.assert_array_equal(together[b], alone[0], err_msg=f"row {b}")
    assert (together[0] != _FREE[0]).any() and (together[2] != _FREE[2]).any()


def test_other_words_in_the_same_bucket_reuse_the_program():
  """Word counts and lengths round up to powers of two and the ids are traced: three words of
  up to three tokens, then four others of up to three, run one program."""
  from asd_jax.plain_decode import _plain_decode
  decode = lambda words: plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                                      sampling=SamplingConfig(bad_words_ids=words))
  decode([(1, 2, 3), (4,), (5, 6)])
  programs = _plain_decode._cache_size()
  decode([(7, 8), (9, 10, 11), (12,), (13,)])
  assert _plain_decode._cache_size() == programs
  decode([(7, 8, 9, 10)])  # a longer word: another W
  assert _plain_decode._cache_size() == programs + 1


def test_pack_pads_to_powers_of_two():
  prefix, last = bad_words.pack(((1, 2, 3), (4,), (5, 6)), vocab_size=10)
  np.testing.assert_array_equal(prefix, [[1, 2], [-1, -1], [-1, 5], [-1, -1]])
  np.testing.assert_array_equal(last, [3, 4, 6, bad_words.NO_TOKEN])
  prefix, last = bad_words.pack(((4,),), vocab_size=10)
  assert prefix.shape == (1, 0) and last.tolist() == [4]


@pytest.mark.parametrize("words,match", [
    ([()], "empty word"), ([[1, -2]], "an integer >= 0"), ([[1.0]], "an integer >= 0"),
    ([[True]], "an integer >= 0"), ("12", "a list of token id lists"),
    ([5], "each bad word is a list of token ids"), (5, "a list of token id lists"),
    ([[i] for i in range(129)], "129 token sequences; at most 128"),
    ([list(range(i * 20, i * 20 + 20)) for i in range(52)], "1040 tokens in all; at most 1024")])
def test_bad_settings_are_refused(words, match):
  with pytest.raises(ValueError, match=match):
    SamplingConfig(bad_words_ids=words)


def test_settings_the_model_cannot_honour_are_refused_before_decoding():
  with pytest.raises(ValueError, match=r"token id 97 outside the vocabulary \[0, 97\)"):
    plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                 sampling=SamplingConfig(bad_words_ids=[(3, 97)]))
  # Allowed ids that all end a bad word: after a 3, both 3 and 4 are banned (a dead end that
  # would otherwise leave no token to choose), so the request is refused, not decoded.
  with pytest.raises(ValueError, match="every one of allowed_token_ids ends a bad word"):
    asd_decode(_FNS, _PARAMS, ngram_drafter(4, VOCAB), None, _PROMPT, _LENGTHS, max_new_tokens=8,
               sampling=SamplingConfig(bad_words_ids=[(3, 3), (3, 4), (5, 6)],
                                       allowed_token_ids=[3, 4]))
  with pytest.raises(ValueError, match="holds only EOS ids, which min_tokens holds back, "
                     "besides ids that end a bad word"):
    plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8, eos_ids=(4,),
                 sampling=SamplingConfig(bad_words_ids=[(2, 3)], allowed_token_ids=[3, 4],
                                         min_tokens=2))
  # One allowed id no word ends is enough: every answer can always go on.
  out = plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                     sampling=SamplingConfig(bad_words_ids=[(3, 3), (3, 4)],
                                             allowed_token_ids=[3, 4, 5]))
  for row in np.asarray(out.tokens_BxN).tolist():
    assert set(row) <= {3, 4, 5} and not holds(row, (3, 3)) and not holds(row, (3, 4))
  assert SamplingConfig(bad_words_ids=[[3, 4], (3, 4), (2,)]).bad_words_ids == ((2,), (3, 4))


def test_the_tokenizer_gives_the_word_and_its_mid_sentence_form():
  """SmolLM2's tokenizer writes "Paris" at the start of a text and " Paris" after a space as
  other tokens: both are banned. A word given with leading spaces is the same word; one of
  whitespace only is banned as written."""
  from models.tokenizer import bad_words_ids, load_tokenizer
  tokenizer = load_tokenizer("smollm2-135m")

  def encode(text):
    return tuple(tokenizer(text, add_special_tokens=False)["input_ids"])
  assert bad_words_ids(tokenizer, ["Paris"]) == (encode("Paris"), encode(" Paris"))
  assert encode("Paris") != encode(" Paris")
  assert bad_words_ids(tokenizer, ["  Paris"]) == bad_words_ids(tokenizer, ["Paris"])
  assert bad_words_ids(tokenizer, ["the capital"])[0] == encode("the capital")
  assert bad_words_ids(tokenizer, ["\n"])[0] == encode("\n")
  with pytest.raises(ValueError, match="is empty"):
    bad_words_ids(tokenizer, ["ok", ""])
