"""Tokenizers (with chat templates) for the checkpoints that models/registry.py resolves.

transformers builds a GGUF's tokenizer from the file's metadata, which takes seconds; the result
is saved once next to the converted weights (<cache entry>/tokenizer/) and read from there.
Only local files are read: there is no model hub at run time.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from models.errors import CheckpointError
from models.registry import cache_entry_dir, resolve_checkpoint, write_atomically

log = logging.getLogger(__name__)

# The cache folder is renamed into place whole, so this file's presence means a usable folder
# (save_pretrained writes it in transformers 4.x and 5.x).
_MARKER = "tokenizer_config.json"


def load_tokenizer(name_or_path: str | os.PathLike, cache: bool = True):
  """Returns a transformers tokenizer (with chat template) for a known name, HF folder or GGUF.

  Raises the errors of resolve_checkpoint (UnknownModelError, CheckpointError).
  """
  from transformers import AutoTokenizer  # heavy import; weights-only callers never pay it

  resolved = resolve_checkpoint(name_or_path)
  if resolved.kind == "hf_folder":
    try:
      return AutoTokenizer.from_pretrained(resolved.path, local_files_only=True)
    except (OSError, ValueError) as e:  # transformers' own message spans lines, names no folder
      first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CheckpointError(f"{resolved.path}: no usable tokenizer (tokenizer.json or "
                            f"tokenizer.model with tokenizer_config.json): {first_line}") from e

  folder = cache_entry_dir(resolved) / "tokenizer" if cache else None
  if folder is not None and (folder / _MARKER).is_file():
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
  if importlib.util.find_spec("torch") is None:
    # transformers reads a GGUF's tokenizer with a module that needs torch (5.25's imports it at
    # the top), and asd-jax does not require torch (a test extra): read the metadata ourselves.
    from models.gguf_tokenizer import gguf_tokenizer_without_torch
    tokenizer = gguf_tokenizer_without_torch(resolved.path)
  else:
    tokenizer = AutoTokenizer.from_pretrained(
        resolved.tokenizer_dir, gguf_file=resolved.tokenizer_gguf_file, local_files_only=True)
  if folder is not None:
    try:
      write_atomically(folder, tokenizer.save_pretrained)
    except OSError as e:  # an unwritable cache only costs speed next time
      log.warning("could not cache the tokenizer of %s in %s: %s", resolved.path, folder, e)
  return tokenizer


def check_tokenizer_fits(tokenizer, vocab_size: int, name_or_path: str | os.PathLike) -> None:
  """Raises CheckpointError when the tokenizer has ids past the model's vocabulary: its files
  belong to other weights. A vocab_size above the tokenizer's is normal (padded embeddings)."""
  tokens = len(tokenizer)  # added tokens included: they are ids the tokenizer can emit
  if tokens > vocab_size:
    where = resolve_checkpoint(name_or_path).path
    raise CheckpointError(f"{where}: the tokenizer has {tokens} tokens but the model's "
                          f"vocab_size is {vocab_size}; the tokenizer files belong to another "
                          "model")


CHAT_ROLES = ("system", "user", "assistant")


def chat_messages(prompt: str | Sequence[Mapping[str, Any]], system: str | None = None,
                  where: str = "messages") -> list[dict[str, str]]:
  """The conversation a request sends to the chat template, checked: a user message (a string)
  or a conversation (OpenAI's / vLLM's list of {"role", "content"} objects), with `system`, if
  given, as its first message (it replaces the template's default system prompt where it has
  one).

  Raises ValueError, naming `where`, for a blank message, a role other than system / user /
  assistant, another key, a system message after the first, a conversation whose last message is
  not the user's (the answer is the assistant's next turn), or `system` beside a conversation
  that already opens with one (which of the two was meant is not ours to guess).
  """
  if isinstance(prompt, str):
    messages = [{"role": "user", "content": prompt}]
  elif isinstance(prompt, Sequence) and prompt:
    messages = []
    for i, message in enumerate(prompt):
      if not isinstance(message, Mapping) or set(message) != {"role", "content"}:
        raise ValueError(f'{where}: message {i} must be an object with exactly the keys "role" '
                         f'and "content", got {message!r:.80}')
      role, content = message["role"], message["content"]
      if role not in CHAT_ROLES:
        raise ValueError(f"{where}: message {i} has role {role!r:.40}; the roles are "
                         f"{', '.join(map(repr, CHAT_ROLES))}")
      if not isinstance(content, str):
        raise ValueError(f'{where}: message {i}\'s "content" must be a string')
      if role == "system" and i > 0:
        raise ValueError(f"{where}: message {i} is a system message; only the first may be")
      messages.append({"role": role, "content": content})
    if messages[-1]["role"] != "user":
      raise ValueError(f"{where}: the last message is the {messages[-1]['role']}'s; a request "
                       "ends with the user's message (the answer is the assistant's next turn)")
  else:
    raise ValueError(f"{where} must be a string or a non-empty list of messages, got "
                     f"{prompt!r:.80}")
  if system is not None:
    if not system.strip():
      raise ValueError(f"{where}: the system message is blank")
    if messages[0]["role"] == "system":
      raise ValueError(f"{where}: the conversation opens with its own system message and a "
                       "system message was given besides; give one")
    messages.insert(0, {"role": "system", "content": system})
  blank = [i for i, m in enumerate(messages) if not m["content"].strip()]
  if blank:
    raise ValueError(f"empty prompt: {where}: message {blank[0]} ({messages[blank[0]]['role']}) "
                     "is blank")
  return messages


def encode_chat(tokenizer, prompt: str | Sequence[Mapping[str, Any]],
                system: str | None = None) -> list[int]:
  """Token ids of a chat (a user message, or a conversation: see `chat_messages`), ending with
  the assistant prompt (no BOS added twice).

  The template is rendered to text and tokenised with add_special_tokens=False, which is what
  apply_chat_template does internally; rendering first avoids its return type changing across
  transformers versions (list in 4.x, BatchEncoding in 5.x).
  """
  messages = chat_messages(prompt, system)
  if not getattr(tokenizer, "chat_template", None):
    raise CheckpointError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
  from jinja2.exceptions import TemplateError  # transformers' template engine
  try:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  except TemplateError as e:  # e.g. a template without a system role (Gemma's, Mistral's)
    raise ValueError(f"the chat template of {tokenizer.name_or_path!r} refused the messages "
                     f"(roles {', '.join(m['role'] for m in messages)}): {e}") from None
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def bad_words_ids(tokenizer, words: Sequence[str]) -> tuple[tuple[int, ...], ...]:
  """The token sequences that ban `words` (vLLM's bad_words): each word (leading spaces
  stripped) as the tokenizer encodes it at the start of a text, and, where a space before it
  gives another first token over as many tokens, that form too (the word in mid-sentence, as
  BPE tokenizers like SmolLM2's write it); vLLM reads bad words the same way. A word of
  whitespace only ("\n") is banned as written. Raises ValueError for an empty word."""
  ids = []
  for word in words:
    if not isinstance(word, str) or not word:
      raise ValueError(f"bad word {word!r} is empty: it would ban nothing (drop it)")
    word = word.lstrip() or word
    alone = list(tokenizer(word, add_special_tokens=False)["input_ids"])
    spaced = list(tokenizer(" " + word, add_special_tokens=False)["input_ids"])
    ids.append(tuple(alone))
    if len(spaced) == len(alone) and spaced[0] != alone[0]:
      ids.append(tuple(spaced))
  return tuple(ids)


def eos_token_ids(tokenizer, hf_config: Mapping[str, Any]) -> tuple[int, ...]:
  """Ids that end a generation: config eos_token_id (int or list) first, then the tokenizer's.

  Order-preserving and without duplicates; empty only if neither side names one.
  """
  ids: list[int] = []
  configured = hf_config.get("eos_token_id")
  if isinstance(configured, Iterable) and not isinstance(configured, (str, bytes)):
    ids.extend(int(i) for i in configured)
  elif configured is not None:
    ids.append(int(configured))
  if getattr(tokenizer, "eos_token_id", None) is not None:
    ids.append(int(tokenizer.eos_token_id))
  return tuple(dict.fromkeys(ids))
