"""`python -m asd_jax.generate`: generate text from a target model (plain decoding for now).

Examples:
  python -m asd_jax.generate --prompt "What is the capital of France?"
  python -m asd_jax.generate --target path/to/hf_folder --prompt-ids 1,2,3 --json
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from asd_jax.cli_common import enable_compilation_cache, parse_prompt_ids, right_pad, run_cli
from asd_jax.plain_decode import plain_decode
from asd_jax.sampling import SamplingConfig


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m asd_jax.generate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m",
                 help="HF folder, GGUF file, or a known name (default: smollm2-135m)")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--prompt", help="user message; the chat template is applied")
  src.add_argument("--prompt-ids", help="raw comma-separated token ids, no template")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  p.add_argument("--top-k", type=int, default=0, help="0 = off")
  p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="parameter/activation dtype (float32 on CPU, bfloat16 on TPU/GPU)")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  return p


@run_cli
def main(argv=None):
  args = build_parser().parse_args(argv)
  sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  if args.max_new_tokens <= 0:
    raise ValueError(f"--max-new-tokens must be positive, got {args.max_new_tokens}")
  if args.prompt is not None and not args.prompt.strip():
    raise ValueError("empty prompt: --prompt is blank")
  enable_compilation_cache()

  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  loaded = load_decoder(args.target, dtype=args.dtype)
  tokenizer = load_tokenizer(args.target)
  load_s = time.perf_counter() - t0
  if args.prompt is not None:
    ids = encode_chat(tokenizer, args.prompt)
  else:
    ids = parse_prompt_ids(args.prompt_ids)
  eos = () if args.ignore_eos else eos_token_ids(tokenizer, loaded.hf_config)
  fns, params = decoder_fns(loaded.model, name=args.target)
  prompt, lengths = right_pad([ids])

  t0 = time.perf_counter()
  result = plain_decode(fns, params, prompt, lengths, max_new_tokens=args.max_new_tokens,
                        eos_ids=eos, sampling=sampling, seed=args.seed)
  result = jax.block_until_ready(result)
  wall_s = time.perf_counter() - t0
  n = int(result.num_generated_B[0])
  tokens = np.asarray(result.tokens_BxN[0, :n]).tolist()
  if bool(result.nonfinite_B[0]):
    raise ValueError("the model produced non-finite logits; generation stopped")
  text = tokenizer.decode(tokens, skip_special_tokens=True)
  stats = {
      "mode": "plain",
      "prompt_tokens": len(ids),
      "new_tokens": n,
      "target_forwards": int(result.target_forwards_B[0]),
      "tau": 1.0,
      "load_s": round(load_s, 3),
      "wall_s": round(wall_s, 3),  # includes compilation unless the persistent cache had it
      "tokens_per_s": round(n / wall_s, 2),
      "dtype": args.dtype,
      "backend": jax.default_backend(),
  }
  if args.json:
    print(json.dumps({"tokens": tokens, "text": text, "stats": stats}))
  else:
    print(text)
    print(f"\n[{n} tokens in {wall_s:.2f} s ({n / wall_s:.1f} tok/s incl. compile), "
          f"load {load_s:.2f} s]")


if __name__ == "__main__":
  main()
