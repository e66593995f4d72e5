"""The C++ engine row: llama.cpp greedy decoding (llama-cpp-python) on the same float32 weights.

Our default target ships as a quantised GGUF that our loader dequantises to float32; llama.cpp
would otherwise run the quantised file, a different (and cheaper) model. `f32_gguf_for` writes
the dequantised tensors back into a GGUF with the original metadata (tokenizer, RoPE, layout:
llama.cpp's own Q/K row order is kept, since llama.cpp reads it), cached next to our other
conversions. The row feeds llama.cpp the same prompt token ids and takes its top-1 token at
every step (sampling off), EOS ignored or honoured like the other rows, one prompt at a time
(llama-cpp-python's `Llama` holds one sequence), with all the machine's cores.

llama-cpp-python is optional: `pip install llama-cpp-python` builds llama.cpp from source
(about 9 minutes on a 2-core machine); the row explains that when the package is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from asd_jax.bench_rows import Batch, BatchOutput, BenchContext, PreparedRow, first_call_only

GGUF_F32_FILE = "model-f32.gguf"
_RESERVED_FIELDS = ("GGUF.", "general.architecture", "general.file_type")


def write_f32_gguf(src: str | os.PathLike, dst: str | os.PathLike) -> None:
  """Copies a GGUF file with every tensor dequantised to float32 (metadata unchanged)."""
  import gguf

  reader = gguf.GGUFReader(src)
  arch = reader.get_field("general.architecture").contents()
  writer = gguf.GGUFWriter(dst, arch)
  for name, field in reader.fields.items():
    if name.startswith(_RESERVED_FIELDS):
      continue  # written by GGUFWriter itself, or changed below
    vtype = field.types[0]
    sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
    writer.add_key_value(name, field.contents(), vtype, sub_type=sub_type)
  writer.add_file_type(gguf.LlamaFileType.ALL_F32)
  for tensor in reader.tensors:
    data = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    writer.add_tensor(tensor.name, np.ascontiguousarray(data, np.float32))
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def f32_gguf_for(target: str | os.PathLike) -> Path:
  """A float32 GGUF of `target` (a GGUF file or a known name), converted once and cached."""
  from models.registry import cache_entry_dir, resolve_checkpoint, write_atomically

  resolved = resolve_checkpoint(target)
  if resolved.kind != "gguf":
    raise ValueError(f"the llama.cpp row needs a GGUF target; {target!r} is an HF folder "
                     f"(convert it with llama.cpp's convert_hf_to_gguf.py and pass the .gguf)")
  folder = cache_entry_dir(resolved) / "llama_cpp_f32"
  if not (folder / GGUF_F32_FILE).is_file():
    write_atomically(folder, lambda tmp: write_f32_gguf(resolved.path, Path(tmp) / GGUF_F32_FILE))
  return folder / GGUF_F32_FILE


def import_llama_cpp():
  """The optional llama-cpp-python module, or a ValueError saying how to install it (the bench
  CLI calls this before its model load, so a missing package fails in a second)."""
  try:
    import llama_cpp
  except ImportError:
    raise ValueError("the llama.cpp row needs llama-cpp-python: `.venv/bin/pip install "
                     "llama-cpp-python` (builds llama.cpp from source, ~9 minutes on 2 cores), "
                     "or leave out --llama-cpp") from None
  return llama_cpp


def greedy_tokens(llm, prompt: list[int], max_new_tokens: int, eos_ids: tuple[int, ...]):
  """llama.cpp's top-1 continuation of `prompt`: N tokens, or up to the first EOS in eos_ids."""
  out: list[int] = []
  # top_k=1 makes every sampler stage a no-op choice of the argmax; penalties are off.
  for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                            repeat_penalty=1.0, reset=True):
    out.append(int(token))
    if len(out) >= max_new_tokens or token in eos_ids:
      break
  return out


def llama_cpp_greedy(ctx: BenchContext) -> PreparedRow:
  llama_cpp = import_llama_cpp()
  path = f32_gguf_for(ctx.target)
  longest = max(len(r) for b in ctx.batches for r in b.rows)
  llm = llama_cpp.Llama(model_path=str(path), n_ctx=longest + ctx.max_new_tokens + 8,
                        n_threads=os.cpu_count(), n_batch=512, seed=0, verbose=False)

  def run_batch(batch: Batch) -> BatchOutput:
    return BatchOutput([greedy_tokens(llm, list(r), ctx.max_new_tokens, ctx.eos_ids)
                        for r in batch.rows])

  def warmup() -> None:
    # A full-length answer: llama.cpp's first pass pages in the mmapped weights and sizes
    # its buffers; measured here, the first calls of a fresh instance ran several times slower.
    greedy_tokens(llm, list(ctx.batches[0].rows[0]), ctx.max_new_tokens, ())

  return PreparedRow("llama_cpp_greedy", run_batch, first_call_only(warmup),
                     extra={"weights": str(path), "engine": "llama.cpp",
                            "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
                            "threads": os.cpu_count(), "note": "one prompt at a time"})
