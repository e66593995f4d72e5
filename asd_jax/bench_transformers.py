"""The reference row: transformers `generate` (greedy, fp32, CPU torch) on the same weights.

The weights come from the same HF folder our loader reads: the folder itself for an HF-folder
target, or the registry's float32 conversion of a GGUF target. torch threads stay at torch's
default. transformers and torch are imported only when this row runs.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from asd_jax.bench_rows import Batch, BatchOutput, BenchContext, PreparedRow, first_call_only


def hf_folder_for(target: str | os.PathLike) -> Path:
  """An HF folder (config.json + safetensors) holding the float32 weights of `target`.

  HF-folder targets are returned as they are. For a GGUF (or a known name) this is the
  registry's conversion cache entry, created on first use; if the cache cannot be written, the
  conversion goes to a fresh temporary folder instead.
  """
  from models.hf_folder import CONFIG_FILE, WEIGHTS_FILE, save_hf_folder
  from models.registry import cache_entry_dir, load_checkpoint, resolve_checkpoint

  resolved = resolve_checkpoint(target)
  if resolved.kind == "hf_folder":
    return Path(resolved.path)
  config, tensors = load_checkpoint(target)   # writes the cache entry when it can
  folder = cache_entry_dir(resolved) / "model"
  if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
    return folder
  folder = Path(tempfile.mkdtemp(prefix="asd-jax-bench-hf-"))
  save_hf_folder(folder, config, tensors)
  return folder


def greedy_generate_kwargs(ctx: BenchContext, *models) -> tuple[dict, int]:
  """(generate() kwargs, pad id) for the bench workload: greedy, N = ctx.max_new_tokens.

  With EOS ignored the EOS id is switched off rather than suppressed (see
  `transformers_generate_greedy`), in the kwargs and in each model's generation_config (an
  assistant model drafts with its own config). Sampling knobs a checkpoint's
  generation_config may carry are cleared: they would only trigger warnings.
  """
  n = ctx.max_new_tokens
  ignore_eos = not ctx.eos_ids
  pad_id = ctx.eos_ids[0] if ctx.eos_ids else 0
  kwargs = dict(do_sample=False, max_new_tokens=n, pad_token_id=pad_id,
                eos_token_id=None if ignore_eos else list(ctx.eos_ids))
  if ignore_eos:
    kwargs["min_new_tokens"] = n
  for m in models:
    m.generation_config.temperature = None
    m.generation_config.top_p = None
    m.generation_config.top_k = None
    if ignore_eos:
      m.generation_config.eos_token_id = None
  return kwargs, pad_id


def until_eos(tokens: list[int], eos_ids) -> list[int]:
  """`tokens` up to and including the first EOS (all of them without one or without eos_ids)."""
  stop = next((i for i, t in enumerate(tokens) if t in eos_ids), len(tokens) - 1)
  return tokens[:stop + 1]


def transformers_generate_greedy(ctx: BenchContext) -> PreparedRow:
  """`model.generate(do_sample=False)` on the same token ids, one warm-up call first.

  With EOS ignored the EOS id is switched off (eos_token_id=None) rather than suppressed, so
  the model may emit it and go on, exactly as our loop with no eos_ids does; min_new_tokens = N
  then only guarantees the fixed length. (min_new_tokens alone would mask EOS logits and change
  the greedy path wherever EOS is the argmax.) Batches larger than one are left-padded with an
  attention mask, which is what generate expects for decoder-only models. The model runs on
  the GPU when torch sees one (the accelerator column), else on the CPU.
  """
  import torch
  import transformers
  from transformers import AutoModelForCausalLM

  folder = hf_folder_for(ctx.target)
  t0 = time.perf_counter()
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                               local_files_only=True).eval().to(device)
  load_s = time.perf_counter() - t0
  kwargs, pad_id = greedy_generate_kwargs(ctx, model)

  def run_batch(batch: Batch) -> BatchOutput:
    width = max(len(r) for r in batch.rows)
    ids = torch.full((len(batch.rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(batch.rows):
      ids[b, width - len(r):] = torch.tensor(r, dtype=torch.long)
      mask[b, width - len(r):] = 1
    with torch.inference_mode():
      out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **kwargs)
    return BatchOutput([until_eos(new, ctx.eos_ids) for new in out[:, width:].tolist()])

  return PreparedRow("transformers_generate_greedy", run_batch,
                     warmup=first_call_only(lambda: run_batch(ctx.batches[0])), extra={
                         "model_class": type(model).__name__, "hf_folder": str(folder),
                         "torch_threads": torch.get_num_threads(), "torch_device": device,
                         "load_s": round(load_s, 2),
                         "transformers_version": transformers.__version__})
