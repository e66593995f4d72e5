"""Which tokens can complete a stop string: a device-side gate in front of the host check.

The stop-string check is a host callback (asd_jax/stop_strings.py), and a callback inside the
compiled loop costs about a millisecond per round on a CPU even when it finds nothing, mostly in
the thread pool's hand-off rather than in Python. Almost every round completes no stop string,
and that can be told on the device: a token that completes stop string s (decode(tokens[:n])
holds s, decode(tokens[:n-1]) does not) puts s's last character into the text. So the loop runs
the callback only in rounds whose new tokens include one whose text may hold such a character.

Why that is exact where decoding is local: appending token n changes the text only at its end
(the new token's characters, or a character whose bytes it completes). An occurrence of s that
ends before the changed part was in decode(tokens[:n-1]) already, so a new one ends in it, and
its last character is one the new token brings in that context. What a token brings can depend
on what precedes it (SentencePiece shows a leading space only after other text; WordPiece joins
"##" pieces; word-level tokenizers join with spaces), so a token's characters are those of its
text alone and after each of a few anchor tokens. A token whose text is not settled by that (it
holds U+FFFD: part of a split character; or it rewrites the anchor's text) always counts. A stop
string that itself holds U+FFFD turns the gate off, and so does a tokenizer whose decoding is
not local (`tokenizer_completers`).

Rounds with no such token skip the callback; the next round that calls it checks only its own
new tokens, which stays exact because the skipped rounds completed no stop string.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Iterable, Sequence

import numpy as np

_REPLACEMENT = "\ufffd"  # what a decoder shows for the bytes of a character split across tokens


@dataclasses.dataclass(frozen=True)
class TokenChars:
  """Per character, the tokens whose text may hold it; `unsettled`: tokens that always count."""

  tokens_by_char: dict[str, np.ndarray]
  unsettled: np.ndarray  # bool[vocab_size]

  @classmethod
  def from_decode(cls, decode_batch: Callable[[list[list[int]]], list[str]], vocab_size: int,
                  anchors: Sequence[int] = (), num_anchors: int = 2) -> TokenChars:
    """decode_batch(list of id lists) -> their texts (as the answer is shown). Each token is
    also decoded after `num_anchors` tokens that show ordinary text, to see what it brings
    after other text: the first such ones of `anchors`, then of the vocabulary."""
    ids = list(range(vocab_size))
    texts = [decode_batch([[t] for t in ids])]

    def shows_text(t: int) -> bool:
      return 0 <= t < vocab_size and bool(texts[0][t].strip()) and _REPLACEMENT not in texts[0][t]

    usable = dict.fromkeys(t for t in [*anchors, *ids] if shows_text(t))
    unsettled = np.zeros(vocab_size, np.bool_)
    for anchor in list(usable)[:num_anchors]:
      anchor_text = texts[0][anchor]
      joined = decode_batch([[anchor, t] for t in ids])
      rewrites = np.array([not j.startswith(anchor_text) for j in joined], np.bool_)
      unsettled |= rewrites
      texts.append([j[len(anchor_text):] for j in joined])
    by_char: dict[str, list[int]] = {}
    for t in ids:
      chars = set().union(*(column[t] for column in texts))
      if _REPLACEMENT in chars:
        unsettled[t] = True
      for c in chars:
        by_char.setdefault(c, []).append(t)
    return cls({c: np.asarray(v, np.int32) for c, v in by_char.items()}, unsettled)

  def completers(self, strings: Iterable[str]) -> np.ndarray | None:
    """bool[vocab_size]: the tokens that may complete one of `strings`; None when any token
    may (a stop string holding U+FFFD)."""
    strings = tuple(strings)
    if any(_REPLACEMENT in s for s in strings):
      return None
    mask = self.unsettled.copy()
    for c in {s[-1] for s in strings}:
      mask[self.tokens_by_char.get(c, np.zeros(0, np.int32))] = True
    return mask


_BY_TOKENIZER: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def tokenizer_completers(tokenizer, strings: Sequence[str]) -> np.ndarray | None:
  """TokenChars.completers for a transformers tokenizer (special tokens skipped, as
  StopStrings.from_tokenizer decodes), or None (no gate) where decoding is not local:
  - transformers' clean_up_tokenization_spaces: "Isn '" + "t" reads "Isn't", so "n'" appears
    with a token that brings neither character (the space before the old "'" goes only now).
    A decoder's own `cleanup` (BERT's WordPiece) works on each token alone, which is local;
  - a Python ("slow") tokenizer: it decodes added tokens apart from the text around them.
  The vocabulary is decoded three times once per tokenizer object (about a second for 49k)."""
  if (not getattr(tokenizer, "is_fast", False)
      or getattr(tokenizer, "clean_up_tokenization_spaces", False)):
    return None
  chars = _BY_TOKENIZER.get(tokenizer)
  if chars is None:
    anchors = [i for text in ("a", ".") for i in tokenizer.encode(text, add_special_tokens=False)]
    chars = TokenChars.from_decode(
        lambda seqs: tokenizer.batch_decode(seqs, skip_special_tokens=True), len(tokenizer),
        anchors)
    _BY_TOKENIZER[tokenizer] = chars
  return chars.completers(strings)


def gate_table(masks: Sequence[np.ndarray | None | bool]) -> np.ndarray | None:
  """The loop's B x M table from each row's completers (None: any token may complete; False:
  the row has no stop strings, no token needs the check). A token id at or past a mask's length
  (a model vocabulary padded past its tokenizer's) reads the last column, which is True.
  None when no row has a mask: the gate would pass every round."""
  if not any(isinstance(m, np.ndarray) for m in masks):
    return None
  width = 1 + max((len(m) for m in masks if isinstance(m, np.ndarray)), default=0)
  table = np.zeros((len(masks), width), np.bool_)
  for row, mask in enumerate(masks):
    if mask is None:
      table[row] = True
    elif mask is not False:
      table[row, :len(mask)] = mask
      table[row, len(mask):] = True
  return table
