"""Structured output (vLLM's guided decoding: `guided_regex`, `guided_json`, `guided_choice`;
OpenAI's `response_format` with a JSON schema): a TokenGuide says which tokens may come next in
each state of an automaton over the answer's tokens, so every answer the engines produce is a
whole match of a regular expression (a JSON schema or a list of choices is one too).

The regular expression becomes a token-level automaton with outlines-core (the library vLLM and
outlines build theirs with): `next_SxV[s, t]` is the state after token t in state s, -1 where t
may not come next; `final_S[s]`, the text so far is a whole match, so an EOS id may end it there
(`LogitEdits.of` adds the request's EOS ids at those states; they stay there). The engines apply
it with the other logit edits (asd_jax/logit_edits.py): each logits row walks the automaton
through its context (the committed answer, then a speculative round's drafted tokens before it)
and gets -inf at every token its state does not allow. A drafted token the grammar refuses has
probability 0 under the target, so strict, ASD (its regret is infinite) and `sample` never
accept one: every rule's answer follows the grammar, and strict still equals plain decoding.

Shapes: S states, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

# The engines' dense table costs S x V x 4 bytes on the device, S the state count + 1 rounded up
# to a power of two (a 39-state JSON object over SmolLM2's 49,152 tokens: 64 rows, 12.6 MB);
# past this many entries (1 GiB) a grammar is refused.
MAX_TABLE_ENTRIES = 1 << 28


@dataclasses.dataclass(frozen=True, eq=False)
class TokenGuide:
  """A token-level automaton (see the module docstring). Compares by identity: one object per
  grammar a caller builds, so requests that share it share its compiled shapes. Build one with
  `from_regex`, `from_json_schema` or `from_choice`."""

  next_SxV: np.ndarray  # int32[S, V]: the state after each token; -1: the token may not follow
  final_S: np.ndarray  # bool[S]: the answer so far is a whole match (EOS may end it)
  start: int  # the state before the answer's first token
  source: str  # the regular expression it was built from (for messages)

  @property
  def num_states(self) -> int:
    return self.next_SxV.shape[0]

  @property
  def vocab_size(self) -> int:
    return self.next_SxV.shape[1]

  @classmethod
  def from_regex(cls, pattern: str, tokenizer, vocab_size: int | None = None) -> "TokenGuide":
    """The answers that are whole matches of `pattern` (Rust regex syntax, as outlines-core
    and vLLM read it), spelled in the tokenizer's tokens. vocab_size: the model's (at least
    the tokenizer's length; ids past the tokenizer's are never allowed). Raises ValueError for a
    pattern outlines-core cannot compile or that no token sequence matches."""
    if not isinstance(pattern, str) or not pattern:
      raise ValueError(f"guided_regex must be a non-empty regular expression, got {pattern!r}")
    from outlines_core import Index, Vocabulary
    vocab_size = len(tokenizer) if vocab_size is None else vocab_size
    eos = tokenizer.eos_token_id
    if eos is None:
      raise ValueError("structured output needs a tokenizer with an EOS token")
    by_bytes: dict[bytes, list[int]] = {}
    for token_id, text in token_bytes(tokenizer).items():
      if token_id != eos:
        by_bytes.setdefault(text, []).append(token_id)
    try:
      index = Index(pattern, Vocabulary(eos, by_bytes))
    except (ValueError, RuntimeError) as e:
      raise ValueError(f"guided decoding: cannot compile the regular expression {pattern!r}: "
                       f"{e}") from None
    transitions = index.get_transitions()
    states = sorted(set(transitions) | {index.get_initial_state()}
                    | {s for row in transitions.values() for s in row.values()})
    rows = _power_of_two(len(states) + 1)  # the engines' table (device_table)
    if rows * vocab_size > MAX_TABLE_ENTRIES:
      raise ValueError(f"guided decoding: the grammar has {len(states)} states, a "
                       f"{rows} x {vocab_size} table past {MAX_TABLE_ENTRIES} entries; "
                       "simplify it")
    number = {s: i for i, s in enumerate(states)}
    next_SxV = np.full((len(states), vocab_size), -1, np.int32)
    for state, row in transitions.items():
      tokens = [t for t in row if t != eos]
      next_SxV[number[state], tokens] = [number[row[t]] for t in tokens]
    final_S = np.array([index.is_final_state(s) for s in states], bool)
    start = number[index.get_initial_state()]
    if not (next_SxV[start] >= 0).any() and not final_S[start]:
      raise ValueError(f"guided decoding: no answer in this tokenizer's tokens matches "
                       f"{pattern!r}")
    return cls(next_SxV, final_S, start, pattern)

  @classmethod
  def from_json_schema(cls, schema, tokenizer, vocab_size: int | None = None,
                       whitespace: str | None = None) -> "TokenGuide":
    """Answers that are JSON documents valid under `schema` (a dict or its JSON text), as
    outlines-core writes a schema as a regular expression (the keys in the schema's order;
    whitespace: the regex for the space allowed between tokens, outlines-core's default when
    None)."""
    from outlines_core.json_schema import build_regex_from_schema
    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
      json.loads(text)
      pattern = build_regex_from_schema(text, whitespace) if whitespace is not None else (
          build_regex_from_schema(text))
    except (ValueError, TypeError, RuntimeError) as e:
      raise ValueError(f"guided_json: not a JSON schema outlines-core can follow: {e}") from None
    return cls.from_regex(pattern, tokenizer, vocab_size)

  @classmethod
  def from_choice(cls, choices, tokenizer, vocab_size: int | None = None) -> "TokenGuide":
    """Answers that are exactly one of `choices` (strings)."""
    if isinstance(choices, str) or not choices or not all(
        isinstance(c, str) and c for c in choices):
      raise ValueError(f"guided_choice must be a non-empty list of non-empty strings, got "
                       f"{choices!r}")
    return cls.from_regex("(" + "|".join(map(_escape, choices)) + ")", tokenizer, vocab_size)

  def accepts(self, tokens) -> bool:
    """The tokens (no EOS) are a whole match: what every guided answer that ended at EOS is."""
    state = self.start
    for token in tokens:
      state = int(self.next_SxV[state, token]) if 0 <= token < self.vocab_size else -1
      if state < 0:
        return False
    return bool(self.final_S[state])


def _escape(text: str) -> str:
  """`text` as a literal in outlines-core's (Rust) regex syntax."""
  return "".join("\\" + c if c in r"\.+*?()|[]{}^$#&-~" else c for c in text)


_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def token_bytes(tokenizer) -> dict[int, bytes]:
  """The bytes each ordinary token adds to the text (special tokens left out): byte-level BPE
  tokenizers (GPT-2's, SmolLM2's) spell bytes as printable characters; SentencePiece ones
  (Llama's) write a space as U+2581 and raw bytes as <0xNN>."""
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None:
    raise ValueError("structured output needs a fast (tokenizers) tokenizer")
  decoder = json.loads(backend.to_str()).get("decoder") or {}
  parts = [decoder] + list(decoder.get("decoders") or [])
  byte_level = any(part.get("type") == "ByteLevel" for part in parts)
  special = set(tokenizer.all_special_ids) | {
      i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
  unicode_to_byte = {c: b for b, c in _bytes_to_unicode().items()}
  out = {}
  for token_id, token in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
    if token_id in special or token is None:
      continue
    if byte_level:
      try:
        out[token_id] = bytes(unicode_to_byte[c] for c in token)
      except KeyError:  # an added token written as plain text
        out[token_id] = token.encode()
    elif _BYTE_TOKEN.fullmatch(token):
      out[token_id] = bytes([int(_BYTE_TOKEN.fullmatch(token).group(1), 16)])
    else:
      out[token_id] = token.replace("\u2581", " ").encode()
  return out


def _bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable spelling of each byte (the byte-level BPE alphabet): printable Latin-1
  bytes stand for themselves, the rest are shifted past 255."""
  keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
  spelled, shift = {}, 0
  for b in range(256):
    if b in keep:
      spelled[b] = chr(b)
    else:
      spelled[b] = chr(256 + shift)
      shift += 1
  return spelled


def _power_of_two(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def device_table(guide: TokenGuide, eos_ids) -> tuple[np.ndarray, np.int32]:
  """(table, start): the table the engines walk, for a request whose answers end at eos_ids.
  State 0 is free (every token, and it stays 0: a row without a guide in a per-row batch, and
  where a drafted context leaves the grammar, which verification rejects anyway); the guide's
  states follow from 1; its final states take each EOS id back to themselves. The state count
  rounds up to a power of two (rows of -1), so grammars of a similar size reuse the program."""
  s, vocab = guide.next_SxV.shape
  table = np.full((_power_of_two(s + 1), vocab), -1, np.int32)
  table[0] = 0
  table[1:s + 1] = np.where(guide.next_SxV >= 0, guide.next_SxV + 1, -1)
  finals = np.nonzero(guide.final_S)[0] + 1
  for eos in eos_ids:
    table[finals, eos] = finals
  return table, np.int32(guide.start + 1)


def stack_rows(rows) -> tuple[np.ndarray, np.ndarray]:
  """One (table, start) from `device_table` or None per row as one table (state 0 free, each
  distinct table's states after it) and each row's start [B] (0 for a row without a guide)."""
  vocab = next(table.shape[1] for table, _ in filter(None, rows))
  parts, offset_of, starts, size = [np.zeros((1, vocab), np.int32)], {}, [], 1
  for row in rows:
    if row is None:
      starts.append(0)
      continue
    table, start = row
    if id(table) not in offset_of:
      offset_of[id(table)] = size - 1  # the table's state i >= 1 lands at size - 1 + i
      parts.append(np.where(table[1:] > 0, table[1:] + size - 1, table[1:]))
      size += table.shape[0] - 1
    starts.append(int(start) + offset_of[id(table)])
  table = np.concatenate(parts)
  padded = np.full((_power_of_two(table.shape[0]), vocab), -1, np.int32)
  padded[:table.shape[0]] = table
  return padded, np.array(starts, np.int32)


def walk(table_SxV, state, tokens, keep):
  """The states after tokens[..., j] where keep[..., j] (a prefix), from `state` (the shape of
  tokens without its last axis); a token the table refuses leads to the free state 0."""
  import jax.numpy as jnp
  vocab = table_SxV.shape[1]
  for j in range(tokens.shape[-1]):
    after = table_SxV[state, jnp.clip(tokens[..., j], 0, vocab - 1)]
    state = jnp.where(keep[..., j], jnp.maximum(after, 0), state)
  return state
