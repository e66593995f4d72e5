"""Tokenizers (with chat templates) for the checkpoints that models/registry.py resolves.

transformers builds a GGUF's tokenizer from the file's metadata, which takes seconds; the result
is saved once next to the converted weights (<cache entry>/tokenizer/) and read from there.
Only local files are read: there is no model hub at run time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
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


def encode_chat(tokenizer, prompt: str) -> list[int]:
  """Token ids of a one-turn user chat, ending with the assistant prompt (no BOS added twice).

  The template is rendered to text and tokenised with add_special_tokens=False, which is what
  apply_chat_template does internally; rendering first avoids its return type changing across
  transformers versions (list in 4.x, BatchEncoding in 5.x).
  """
  if not getattr(tokenizer, "chat_template", None):
    raise CheckpointError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
  text = tokenizer.apply_chat_template(
      [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
  return list(tokenizer(text, add_special_tokens=False)["input_ids"])


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
