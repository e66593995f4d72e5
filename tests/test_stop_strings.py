"""Stop strings: each engine ends a row with the token that completes one, and the tokens are
exactly the run without stop strings cut there; the windowed search finds what a search of the
whole text finds."""

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from asd_jax.stop_strings import StopStrings
from asd_jax.token_stream import TokenStream
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.1, seed=5))


def _token_text(t: int) -> str:
  # A small alphabet, so short stop strings occur; some ids show nothing (like skipped special
  # tokens) and some show two characters.
  if t % 7 == 0:
    return ""
  letters = "abcd"
  return letters[t % 4] + (letters[t // 4 % 4] if t % 5 == 0 else "")


def _decode(ids) -> str:
  return "".join(_token_text(t) for t in ids)


def _first_stop_by_full_text(tokens, strings) -> int | None:
  return next((n for n in range(1, len(tokens) + 1)
               if any(s in _decode(tokens[:n]) for s in strings)), None)


def _engine(name):
  if name == "plain":
    return lambda **kw: plain_decode(_FNS, _PARAMS, **kw)
  if name == "chain":
    return lambda **kw: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 4), _DRAFT_PARAMS, **kw)
  tree = TreeShape(depth=3, top_k=2, num_nodes=6)
  return lambda **kw: asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, tree), _DRAFT_PARAMS,
                                      **kw)


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_a_row_ends_with_the_token_that_completes_a_stop_string(engine):
  prompt, lengths = random_prompts(np.random.RandomState(1), 3, 10, VOCAB)
  n_max = 32
  full = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=n_max)
  rows = [np.asarray(full.tokens_BxN[b]).tolist() for b in range(3)]
  # Row 0's text from its 9th token on: a stop string it completes mid-answer (and maybe
  # others do too); a string no row has leaves every row to run to the end.
  text0 = _decode(rows[0][:9])
  stop_text = _decode(rows[0])[len(text0) - 2:len(text0) + 1]
  strings = (stop_text, "dddddddd")
  expected = [_first_stop_by_full_text(r, strings) or n_max for r in rows]
  assert expected[0] < n_max

  delivered = {}
  stream = TokenStream(lambda row, toks: delivered.setdefault(row, []).extend(toks))
  stop = StopStrings(strings, _decode)
  result = _engine(engine)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=n_max,
                           stop=stop, stream=stream)
  for b in range(3):
    n = int(result.num_generated_B[b])
    assert n == expected[b], f"row {b}"
    got = np.asarray(result.tokens_BxN[b]).tolist()
    assert got[:n] == rows[b][:n] and got[n:] == [-1] * (n_max - n), f"row {b}"
    assert delivered[b] == rows[b][:n]  # the stream saw no token past the stop either
    if n < n_max:
      assert stop.find(_decode(got[:n])) is not None
      assert stop.find(_decode(got[:n - 1])) is None
  if engine != "plain":
    # The stats count only kept tokens: the prefill's token, then each round's kept drafts and
    # its own token, which a stop inside the last round's drafts leaves out.
    stats = result.stats
    np.testing.assert_array_equal(np.asarray(stats.round_tokens_B) + 1, expected)
    assert int(stats.accepted_B[0]) + int(stats.rounds_B[0]) + 1 - expected[0] in (0, 1)


def test_the_first_token_can_complete_a_stop_string():
  prompt, lengths = random_prompts(np.random.RandomState(3), 2, 6, VOCAB)
  first = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=1)
  text = _token_text(int(first.tokens_BxN[0, 0]))
  assert text  # else pick another seed: this token shows nothing to stop at
  stop = StopStrings((text[-1],), _decode)
  for engine in ("plain", "chain", "tree"):
    result = _engine(engine)(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=8, stop=stop)
    assert int(result.num_generated_B[0]) == 1, engine


def test_without_a_match_the_output_is_unchanged():
  prompt, lengths = random_prompts(np.random.RandomState(3), 2, 8, VOCAB)
  for engine in ("plain", "chain", "tree"):
    decode = _engine(engine)
    plain = decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=16)
    stopped = decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=16,
                     stop=StopStrings(("zzz",), _decode))
    np.testing.assert_array_equal(plain.tokens_BxN, stopped.tokens_BxN)
    np.testing.assert_array_equal(plain.num_generated_B, stopped.num_generated_B)


class _Boom(Exception):
  pass


def test_a_decode_error_reaches_the_caller_after_the_loop():
  prompt, lengths = random_prompts(np.random.RandomState(4), 1, 6, VOCAB)

  def bad_decode(ids):
    raise _Boom("tokenizer failed")

  stop = StopStrings(("a",), bad_decode)
  with pytest.raises(_Boom, match="tokenizer failed"):
    asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 2), _DRAFT_PARAMS, prompt, lengths,
               max_new_tokens=6, stop=stop)


@pytest.mark.parametrize("strings,decode,error,match", [
    ((), _decode, ValueError, "no stop strings"),
    (("",), _decode, ValueError, "empty stop string"),
    ("abc", _decode, TypeError, "tuple of str"),
    (["a"], _decode, TypeError, "tuple of str"),
    ((3,), _decode, TypeError, "must be a str"),
    (("a",), "not callable", TypeError, "decode must be callable"),
])
def test_bad_stop_strings_are_refused(strings, decode, error, match):
  with pytest.raises(error, match=match):
    StopStrings(strings, decode)


@pytest.mark.parametrize("stop,error,match", [
    ("a", TypeError, "stop must be a StopStrings or a list"),
    (("a",), TypeError, r"stop\[0\] must be a StopStrings or None, got str"),
    ([None, StopStrings(("a",), _decode), None], ValueError, "3 entries for 2 rows"),
])
def test_a_wrong_stop_argument_is_refused(stop, error, match):
  prompt, lengths = random_prompts(np.random.RandomState(5), 2, 5, VOCAB)
  for engine in ("plain", "chain"):
    with pytest.raises(error, match=match):
      _engine(engine)(prompt_BxT=prompt[:2] if error is ValueError else prompt[:1],
                      lengths_B=lengths[:2] if error is ValueError else lengths[:1],
                      max_new_tokens=3, stop=stop)


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_each_row_stops_at_its_own_stop_strings(engine):
  """Per-row stop strings (one request each): every row equals that row decoded alone with
  its own stop strings, and a row with None runs to the end."""
  prompt, lengths = random_prompts(np.random.RandomState(6), 3, 9, VOCAB)
  n_max = 24
  full = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=n_max)
  texts = [_decode(np.asarray(full.tokens_BxN[b]).tolist()) for b in range(3)]
  # Row 0 stops at a string from its own text, row 2 at one from its own; row 1 has none,
  # though row 0's string may occur in its text too.
  per_row = [StopStrings((texts[0][4:6],), _decode), None,
             StopStrings((texts[2][8:11], "dddddddd"), _decode)]
  decode = _engine(engine)
  result = decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=n_max, stop=per_row)
  assert int(result.num_generated_B[1]) == n_max
  for b in range(3):
    alone = decode(prompt_BxT=prompt[b:b + 1], lengths_B=lengths[b:b + 1],
                   max_new_tokens=n_max, stop=per_row[b])
    n = int(alone.num_generated_B[0])
    assert int(result.num_generated_B[b]) == n, f"row {b}"
    np.testing.assert_array_equal(result.tokens_BxN[b], alone.tokens_BxN[0])
  assert int(result.num_generated_B[0]) < n_max and int(result.num_generated_B[2]) < n_max


def test_cut_keeps_the_text_before_the_earliest_stop_string():
  stop = StopStrings(("\n\n", "```"), _decode)
  assert stop.cut("def f():\n  pass\n\nprint(1)```") == "def f():\n  pass"
  assert stop.cut("x = 1```\n\n") == "x = 1"
  assert stop.cut("no stop here") == "no stop here"


def _bytes_decode(ids):
  """Byte-level: a character can span tokens; ids >= 256 show nothing (special tokens)."""
  return bytes(t for t in ids if t < 256).decode("utf-8", errors="replace")


_PIECES = ["a", "b", "é", "€", "ab", "\n", "🙂"]


@hypothesis.settings(max_examples=200, deadline=None)
@hypothesis.given(
    pieces=st.lists(st.sampled_from(_PIECES + ["<special>"]), min_size=1, max_size=40),
    other=st.text(alphabet="abé€\n🙂", min_size=1, max_size=6),
    span=st.tuples(st.floats(0, 1), st.integers(1, 8)),
    commits=st.lists(st.integers(1, 6), min_size=1, max_size=60))
def test_the_windowed_search_finds_the_first_stop_of_the_whole_text(pieces, other, span,
                                                                    commits):
  tokens = [t for p in pieces for t in ([300] * 3 if p == "<special>" else list(p.encode()))]
  # One stop string cut from the answer's own text (so most cases have a match, often across
  # silent tokens or split characters), one arbitrary.
  text = _bytes_decode(tokens)
  start = int(span[0] * max(len(text) - 1, 0))
  strings = tuple(s for s in (text[start:start + span[1]], other) if s)
  stop = StopStrings(strings, _bytes_decode)
  want = next((n for n in range(1, len(tokens) + 1)
               if stop.find(_bytes_decode(tokens[:n])) is not None), None)
  # Commit tokens in rounds of the given sizes, as an engine does, checking each round.
  before, got, sizes = 0, None, iter(commits * (len(tokens) // len(commits) + 1))
  while before < len(tokens) and got is None:
    after = min(len(tokens), before + next(sizes))
    got = stop.first_stop(tokens[:after], before)
    before = after
  assert got == want


def test_the_text_cut_at_or_through_the_stop_string():
  stop = StopStrings(("\n\n", "END", "EN"), _decode)
  assert stop.cut("abc END and more") == "abc "
  assert stop.cut("abc END and more", include=True) == "abc END"  # the first in their order
  assert stop.cut("no stop", include=True) == "no stop"
  assert stop.cut("x\n\ny END", after=3, include=True) == "x\n\ny END"[:9]


def test_settled_text_holds_back_what_may_begin_a_stop_string():
  stop = StopStrings(("\n\n", "END"), _decode)
  assert stop.settled("abc\n") == "abc"  # '\n' may become '\n\n'
  assert stop.settled("abc E") == "abc "
  assert stop.settled("abc EN") == "abc "
  assert stop.settled("abc ENx") == "abc ENx"
  assert stop.settled("abc END and more") == "abc "


def test_a_text_stream_with_stop_strings_prints_exactly_the_answer():
  import io

  from asd_jax.cli_common import text_stream

  class ByteTokenizer:
    def decode(self, ids, skip_special_tokens=True):
      return _bytes_decode(ids)

  answer = "one\ntwo\n\nthree"
  stop = StopStrings.from_tokenizer(ByteTokenizer(), ["\n\n"])
  for cut_by_stop in (True, False):
    out = io.StringIO()
    stream = text_stream(ByteTokenizer(), out=out, stop=stop)
    tokens = list(answer.encode()) if cut_by_stop else list(b"one\ntwo\n")
    seen = []
    for t in tokens:
      stream.on_tokens(0, [t])
      seen.append(out.getvalue())
    assert all("\n\n" not in s for s in seen)
    final = stop.cut(ByteTokenizer().decode(tokens))
    stream.on_tokens.finish(final)
    assert out.getvalue() == final == ("one\ntwo" if cut_by_stop else "one\ntwo\n")


def test_min_tokens_skips_the_stop_strings_that_end_before_it():
  """With min_tokens m a stop string counts only when the token completing it is the m-th or
  later (vLLM's rule); the host check, the cut text and a stream agree on which one ends it."""
  import io

  from asd_jax.cli_common import text_stream

  class ByteTokenizer:
    def decode(self, ids, skip_special_tokens=True):
      return _bytes_decode(ids)

  tokens = list(b"ab\n\ncd\n\nef")
  stop = StopStrings.from_tokenizer(ByteTokenizer(), ["\n\n"])
  for min_tokens, n in ((0, 4), (4, 4), (5, 8), (9, None)):
    # Checked all at once and one token at a time (the window's margin must not revive the
    # early one).
    assert stop.first_stop(tokens, 0, min_tokens) == n, min_tokens
    ends = [i for i in range(len(tokens)) if stop.first_stop(tokens[:i + 1], i, min_tokens)]
    assert ends[:1] == ([] if n is None else [n - 1]), min_tokens
    answer = tokens[:n or len(tokens)]
    shown = stop.cut(_bytes_decode(answer), stop.min_tokens_chars(answer, min_tokens))
    assert shown == {4: "ab", 8: "ab\n\ncd", None: "ab\n\ncd\n\nef"}[n]
    out = io.StringIO()
    stream = text_stream(ByteTokenizer(), out=out, stop=stop, min_tokens=min_tokens)
    for t in answer:
      stream.on_tokens(0, [t])
      assert shown.startswith(out.getvalue())
    stream.on_tokens.finish(shown)
    assert out.getvalue() == shown
