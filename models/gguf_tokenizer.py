"""A GGUF's tokenizer without torch: transformers' GGUF tokenizer converter, given metadata read
by the `gguf` package.

transformers builds a GGUF's tokenizer in two steps: a reader collects the file's tokenizer
metadata, then `convert_gguf_tokenizer` turns it into a `tokenizers` backend. The reader's
module imports torch (transformers 5.25), which asd-jax does not require; the converter does
not. So without torch the metadata is read here, with the reader the weights already use
(models/gguf_file.py), under transformers' own key names (its GGUF_TOKENIZER_MAPPING), and the
converter does the rest. tests/test_loaders.py checks the result against transformers' own
GGUF tokenizer (with torch) on the default model: ids, text, special tokens, chat template.

Used by models/tokenizer.py only when torch is missing; with torch, AutoTokenizer builds it.
"""

from __future__ import annotations

import os

from models.errors import CheckpointError
from models.gguf_file import open_gguf

# Which token each special-token attribute names, as the GGUF stores ids (llama.cpp's keys).
_SPECIAL_TOKEN_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
                      "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def gguf_tokenizer_without_torch(path: str | os.PathLike):
  """The tokenizer a GGUF describes, as a transformers fast tokenizer, built without torch.

  Raises CheckpointError when this transformers has no torch-free converter to call (its GGUF
  code moved) or the file's tokenizer is one the converter does not know.
  """
  try:
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (GGUF_TOKENIZER_MAPPING,
                                                                       convert_gguf_tokenizer)
  except ImportError as e:
    raise CheckpointError(
        f"{path}: building this GGUF's tokenizer needs torch with this transformers (its "
        f"torch-free GGUF tokenizer converter is not where asd-jax calls it: {e}); install "
        "torch once (`pip install torch`, or asd-jax's test extra; `make demo` does) and the "
        "tokenizer is then cached and loads without it, or pass an HF folder with tokenizer "
        "files") from None
  reader = open_gguf(path)
  metadata = {key: field.contents() for key, field in reader.fields.items()
              if key.startswith("tokenizer.") or key == "general.architecture"}
  if "tokenizer.ggml.tokens" not in metadata:
    raise CheckpointError(f"{path}: the GGUF holds no tokenizer (no tokenizer.ggml.tokens)")
  tokenizer, config = ({name: metadata[f"tokenizer.{key}"] for key, name in renames.items()
                        if f"tokenizer.{key}" in metadata}
                       for renames in (GGUF_TOKENIZER_MAPPING["tokenizer"],
                                       GGUF_TOKENIZER_MAPPING["tokenizer_config"]))
  if tokenizer.get("tokenizer_type") == "llama":
    # llama.cpp adds BOS to a sentencepiece vocabulary whose file does not say otherwise.
    config.setdefault("add_bos_token", True)
  for name, key in _SPECIAL_TOKEN_IDS.items():
    token_id = metadata.get(f"tokenizer.ggml.{key}")
    config[name] = None if token_id is None else tokenizer["tokens"][int(token_id)]
  try:
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer)
  except (ValueError, KeyError) as e:
    raise CheckpointError(f"{path}: transformers cannot build this GGUF's tokenizer: {e}") from e
  return PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
