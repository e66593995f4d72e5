"""transformers assisted generation (`generate(assistant_model=...)`, greedy) with our drafter.

The standalone drafter folder (models/drafter_folder.py) borrows the target's embedding and is
stored in bfloat16; transformers needs a self-contained folder, so it is exported once, with the
embedding filled in, as float32 (the exact values our JAX rows compute with), and cached under
the user cache dir keyed by the drafter's files and the target (like the target's float32 HF
folder in bench_transformers). transformers' own assisted-generation settings are used
(`num_assistant_tokens`, its schedule and confidence threshold), recorded in the row.
Assisted generation in transformers is batch 1 only: larger batches are run prompt by prompt.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from asd_jax.bench_rows import Batch, BatchOutput, BenchContext, PreparedRow, first_call_only

ASSISTED_SETTINGS = ("num_assistant_tokens", "num_assistant_tokens_schedule",
                     "assistant_confidence_threshold")


def drafter_hf_folder(draft: str | os.PathLike, target_loaded, target_name: str) -> Path:
  """A self-contained float32 HF folder (LlamaForCausalLM) of a standalone drafter, cached."""
  from models.drafter_folder import (MANIFEST_FILE, SHARED_EMBEDDING_KEY, hf_config_of,
                                     load_standalone_drafter, resolve_drafter)
  from models.hf_folder import CONFIG_FILE, WEIGHTS_FILE, save_hf_folder
  from models.hf_params import decoder_to_hf_tensors
  from models.registry import cache_root, write_atomically

  src = resolve_drafter(draft)
  ident = [target_name]
  for file in sorted(src.iterdir()):
    if file.is_file() and file.name != MANIFEST_FILE:
      st = file.stat()
      ident.append(f"{file.name}:{st.st_size}:{st.st_mtime_ns}")
  digest = hashlib.sha256("\0".join([str(src), *ident]).encode()).hexdigest()[:16]
  folder = cache_root() / "hf_drafters" / f"{src.name}-{digest}"
  if (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file():
    return folder
  model = load_standalone_drafter(src, target=target_loaded, dtype="float32")
  source_config = json.loads((src / CONFIG_FILE).read_text())
  hf = {k: v for k, v in source_config.items()
        if k in ("bos_token_id", "eos_token_id", "pad_token_id")}
  hf.update(hf_config_of(model.cfg))
  hf.pop(SHARED_EMBEDDING_KEY, None)
  tensors = decoder_to_hf_tensors(model)
  write_atomically(folder, lambda tmp: save_hf_folder(tmp, hf, tensors))
  return folder


def transformers_assisted_greedy(draft: str):
  """A RowRunner: transformers greedy `generate` with `draft` as the assistant model."""

  def runner(ctx: BenchContext) -> PreparedRow:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from asd_jax.bench_transformers import greedy_generate_kwargs, hf_folder_for, until_eos

    _, _, loaded = ctx.jax_target
    t0 = time.perf_counter()
    assistant_folder = drafter_hf_folder(draft, loaded, str(ctx.target))
    export_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(hf_folder_for(ctx.target), dtype=torch.float32,
                                                 local_files_only=True).eval()
    assistant = AutoModelForCausalLM.from_pretrained(assistant_folder, dtype=torch.float32,
                                                     local_files_only=True).eval()
    load_s = time.perf_counter() - t0
    kwargs, pad_id = greedy_generate_kwargs(ctx, model, assistant)

    def run_batch(batch: Batch) -> BatchOutput:
      rows = []
      for r in batch.rows:
        ids = torch.tensor([r], dtype=torch.long)
        with torch.inference_mode():
          out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                               assistant_model=assistant, **kwargs)
        rows.append(until_eos(out[0, len(r):].tolist(), ctx.eos_ids))
      return BatchOutput(rows)

    settings = {k: getattr(model.generation_config, k, None) for k in ASSISTED_SETTINGS}
    return PreparedRow(f"transformers_assisted_{Path(str(draft)).name}", run_batch,
                       warmup=first_call_only(lambda: run_batch(ctx.batches[0])), extra={
                           "draft": str(draft), "assistant_hf_folder": str(assistant_folder),
                           "assistant_export_s": round(export_s, 2), "load_s": round(load_s, 2),
                           "assisted_settings": settings,
                           "torch_threads": torch.get_num_threads(),
                           "transformers_version": transformers.__version__})

  return runner
