"""Streaming: what reaches the host, chunk by chunk, is exactly what each engine returns."""

import collections

import numpy as np
import pytest

from asd_jax.draft_tree import TreeShape, lm_tree_drafter
from asd_jax.drafter_api import lm_chain_drafter
from asd_jax.plain_decode import plain_decode
from asd_jax.spec_decode import asd_decode
from asd_jax.token_stream import TokenStream
from asd_jax.tree_decode import asd_tree_decode
from models.lm_fns import decoder_fns
from tests.tiny_models import perturbed_copy, random_decoder, random_prompts

VOCAB = 61
_TARGET = random_decoder(seed=0, vocab=VOCAB, num_layers=2)
_FNS, _PARAMS = decoder_fns(_TARGET)
_, _DRAFT_PARAMS = decoder_fns(perturbed_copy(_TARGET, 0.1, seed=5))


def _collector():
  chunks = collections.defaultdict(list)
  return chunks, TokenStream(lambda row, tokens: chunks[row].append(tokens))


def _check(result, chunks, batch):
  for b in range(batch):
    n = int(result.num_generated_B[b])
    streamed = [t for chunk in chunks.get(b, []) for t in chunk]
    assert streamed == np.asarray(result.tokens_BxN[b, :n]).tolist(), f"row {b}"
    assert all(chunk for chunk in chunks.get(b, []))  # no empty deliveries


def _engines():
  yield "plain", lambda **kw: plain_decode(_FNS, _PARAMS, **kw), None
  yield "chain", lambda **kw: asd_decode(_FNS, _PARAMS, lm_chain_drafter(_FNS, 3),
                                         _DRAFT_PARAMS, **kw), 3
  tree = TreeShape(depth=3, top_k=2, num_nodes=6)
  yield "tree", lambda **kw: asd_tree_decode(_FNS, _PARAMS, lm_tree_drafter(_FNS, tree),
                                             _DRAFT_PARAMS, **kw), 3


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_streamed_tokens_equal_the_result(engine):
  name, decode, depth = next(e for e in _engines() if e[0] == engine)
  prompt, lengths = random_prompts(np.random.RandomState(1), 3, 10, VOCAB)
  chunks, stream = _collector()
  # Row 1 stops early by max_new_B, row 2 by EOS (an id the target emits), row 0 runs to N.
  first = plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=20)
  eos = int(first.tokens_BxN[2, 6])
  kwargs = dict(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=20, eos_ids=(eos,),
                max_new_B=np.array([20, 7, 20], np.int32))
  result = decode(stream=stream, **kwargs)
  _check(result, chunks, 3)
  assert int(result.num_generated_B[1]) == 7
  assert int(result.num_generated_B[2]) <= 7  # stopped at (or before) that EOS
  if depth is not None:
    # Speculative rounds deliver up to depth+1 tokens at once (prefill's first token alone).
    assert max(len(c) for b in chunks for c in chunks[b]) <= depth + 1
    assert all(len(chunks[b][0]) == 1 for b in chunks)
    rounds = np.asarray(result.stats.rounds_B)
    assert len(chunks[0]) == rounds[0] + 1
  # Same output with and without the stream.
  plain_result = decode(**kwargs)
  np.testing.assert_array_equal(plain_result.tokens_BxN, result.tokens_BxN)


@pytest.mark.parametrize("stream", [print, [], {}], ids=["function", "list", "dict"])
def test_a_wrong_stream_object_is_refused(stream):
  prompt, lengths = random_prompts(np.random.RandomState(2), 1, 5, VOCAB)
  with pytest.raises(TypeError, match="stream must be a TokenStream"):
    plain_decode(_FNS, _PARAMS, prompt, lengths, max_new_tokens=3, stream=stream)


class _Boom(Exception):
  pass


@pytest.mark.parametrize("engine", ["plain", "chain", "tree"])
def test_the_callbacks_own_exception_reaches_the_caller(engine):
  """XLA cannot carry a Python exception out of the loop (it became an INTERNAL runtime
  error); the engine raises the callback's own exception after the loop, calls the callback
  no more once it has raised, and the same stream works again on the next call."""
  _, decode, _ = next(e for e in _engines() if e[0] == engine)
  prompt, lengths = random_prompts(np.random.RandomState(3), 2, 8, VOCAB)
  calls = []

  def on_tokens(row, tokens):
    calls.append(row)
    if fail:
      raise _Boom(f"row {row}")

  stream = TokenStream(on_tokens)
  fail = True
  with pytest.raises(_Boom, match="row"):
    decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=12, stream=stream)
  assert len(calls) == 1
  fail, calls[:] = False, []
  result = decode(prompt_BxT=prompt, lengths_B=lengths, max_new_tokens=12, stream=stream)
  assert len(calls) > 1 and int(result.num_generated_B[0]) == 12


class _ByteTokenizer:
  """Token id = one UTF-8 byte, so a character can span tokens."""

  def decode(self, ids, skip_special_tokens=True):
    return bytes(ids).decode("utf-8", errors="replace")


def test_text_stream_prints_whole_characters_only_and_ignores_other_rows():
  import io

  from asd_jax.cli_common import text_stream
  out = io.StringIO()
  stream = text_stream(_ByteTokenizer(), row=0, out=out)
  e_acute = "é".encode()
  stream.on_tokens(0, list(b"caf") + [e_acute[0]])
  assert out.getvalue() == ""  # 'caf' + half of 'é' decodes with U+FFFD: wait for the rest
  stream.on_tokens(1, list(b"other row"))
  stream.on_tokens(0, [e_acute[1]] + list(b"!"))
  assert out.getvalue() == "café!"
