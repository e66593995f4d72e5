"""What an option costs the decode loop: stop strings, a token stream, logprobs, the logit
edits min_tokens, logit_bias and allowed_token_ids, bad words, or a structured-output guide.

  python scripts/option_overhead.py --option stop --json docs/bench/option_overhead_stop_cpu.json
  python scripts/option_overhead.py --option logprobs --json out/option_overhead_logprobs.json

For plain greedy decoding and for a speculative chain (`--draft`, strict), each MT-Bench prompt
is decoded with and without the option, EOS ignored, `--max-new-tokens` each:
- stop: a stop string the answer never holds (`--stop`), so it measures the search, not a
  shorter answer: the host callback in each step or round that commits a token which may
  complete it (asd_jax/stop_gate.py).
- stop-ungated: the same stop string without that gate: the callback after every step or round.
- stream: a TokenStream whose callback does nothing; the same callback round trip.
- logprobs: logprobs=True; a log-softmax over the vocabulary per committed position.
- top-logprobs: logprobs=True, top_logprobs=5; also a top-5 over the vocabulary per position.
- logit-edits: min_tokens = --max-new-tokens, holding back an "EOS" (the vocabulary's
  second-to-last id, which the answers never choose), a logit_bias of -100 on its last id and
  allowed_token_ids of every id but the last: the bias added and the two masks applied at every
  position, which change no choice here.
- bad-words: 32 bad words (vLLM's limit is 128) of the vocabulary's last ids, which the
  answers never choose: one of one token (banned at every position) and 31 of four, matched
  against the answer's last three tokens (and each draft position's context) at every position:
  the match and the ban mask, which change no choice here.
- guide: a structured-output guide (asd_jax/token_guide.py) for the regex [\s\S]* (any text),
  with an "EOS" the answers never choose (as logit-edits): the state walk and the mask of
  allowed tokens at every position, which change no choice here.
The two runs of an engine alternate prompt by prompt (`--passes` times over the prompts), so
both see the same background load; the table gives tokens per second, the ratio, and the added
milliseconds per decode step (plain: per token; speculative: per verification round). The
script fails if a run with the option returns other tokens than the run without, or if the stop
string was met (then it measures nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import jax  # noqa: E402

from asd_jax.bench_prompts import load_prompts  # noqa: E402
from asd_jax.cli_common import right_pad  # noqa: E402
from asd_jax.plain_decode import plain_decode  # noqa: E402
from asd_jax.sampling import SamplingConfig  # noqa: E402
from asd_jax.stop_strings import StopStrings  # noqa: E402
from asd_jax.token_stream import TokenStream  # noqa: E402
from models.drafter_setup import default_k, setup_drafter  # noqa: E402
from models.lm_fns import decoder_fns  # noqa: E402
from models.load import load_decoder  # noqa: E402
from models.tokenizer import check_tokenizer_fits, encode_chat, load_tokenizer  # noqa: E402

OPTIONS = ("stop", "stop-ungated", "stream", "logprobs", "top-logprobs", "logit-edits",
           "bad-words", "guide")


def engine_calls(args, loaded):
  """{engine name: call(prompt, lengths, **option) -> (tokens, steps)}."""
  fns, params = decoder_fns(loaded.model, name=args.target)

  def plain(prompt, lengths, **option):
    option = {"eos_ids": (), **option}
    out = jax.device_get(plain_decode(fns, params, prompt, lengths,
                                      max_new_tokens=args.max_new_tokens, **option))
    tokens = out.tokens_BxN[0, :out.num_generated_B[0]].tolist()
    return tokens, len(tokens)

  k = args.k or default_k(args.draft, jax.default_backend())
  setup = setup_drafter(args.draft, loaded, k=k, tree=None, target_name=args.target)

  def speculative(prompt, lengths, **option):
    option = {"eos_ids": (), **option}
    out = jax.device_get(setup.decode(setup.target_fns, setup.target_params, setup.drafter,
                                      setup.params, prompt, lengths,
                                      max_new_tokens=args.max_new_tokens, rule="strict",
                                      **option))
    return out.tokens_BxN[0, :out.num_generated_B[0]].tolist(), int(out.stats.rounds_B[0])

  return {"plain": plain, f"{args.draft} K={k} strict": speculative}


def option_kwargs(name: str, tokenizer, stop_text: str, vocab_size: int,
                  max_new_tokens: int) -> dict:
  if name == "logit-edits":
    return {"sampling": SamplingConfig(min_tokens=max_new_tokens,
                                       logit_bias={vocab_size - 1: -100.0},
                                       allowed_token_ids=range(vocab_size - 1)),
            "eos_ids": (vocab_size - 2,)}
  if name == "bad-words":
    last = vocab_size - 1
    return {"sampling": SamplingConfig(bad_words_ids=[(last,)] + [
        (last - i, last - i - 1, last - i - 2, last - i - 3) for i in range(1, 32)])}
  if name == "guide":
    from asd_jax.token_guide import TokenGuide
    return {"sampling": SamplingConfig(guide=TokenGuide.from_regex(r"[\s\S]*", tokenizer,
                                                                   vocab_size)),
            "eos_ids": (vocab_size - 2,)}
  if name == "stop":
    return {"stop": StopStrings.from_tokenizer(tokenizer, (stop_text,))}
  if name == "stop-ungated":
    gated = StopStrings.from_tokenizer(tokenizer, (stop_text,))
    return {"stop": dataclasses.replace(gated, completers=None)}
  if name == "stream":
    return {"stream": TokenStream(lambda row, tokens: None)}
  if name == "top-logprobs":
    return {"logprobs": True, "top_logprobs": 5}
  return {"logprobs": True}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--option", choices=OPTIONS, default="stop")
  p.add_argument("--target", default="smollm2-135m")
  p.add_argument("--draft", default="ngram+store")
  p.add_argument("--k", type=int, default=0, help="draft length (default: the drafter's own)")
  p.add_argument("--prompts", type=int, default=4, help="MT-Bench prompts")
  p.add_argument("--passes", type=int, default=5)
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--stop", default="<<never-met stop string>>", help="with --option stop")
  p.add_argument("--json", default="")
  args = p.parse_args(argv)
  for name in ("prompts", "passes", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
  if args.k < 0:
    p.error(f"--k must be positive, got {args.k}")
  if not args.stop:
    p.error("--stop '' would end every answer at once; give a text the answers never hold")

  tokenizer = load_tokenizer(args.target)
  loaded = load_decoder(args.target)
  check_tokenizer_fits(tokenizer, loaded.cfg.vocab_size, args.target)
  option = option_kwargs(args.option, tokenizer, args.stop, loaded.cfg.vocab_size,
                         args.max_new_tokens)
  rows = [right_pad([encode_chat(tokenizer, q.text)])
          for q in load_prompts(("mt_bench",), args.prompts)]
  calls = engine_calls(args, loaded)

  walls = {(e, on): 0.0 for e in calls for on in (False, True)}
  tokens = dict.fromkeys(walls, 0)
  steps = dict.fromkeys(walls, 0)
  for call in calls.values():       # compile both programs of each prompt width, untimed
    for prompt, lengths in rows:
      call(prompt, lengths)
      call(prompt, lengths, **option)
  for _ in range(args.passes):
    for prompt, lengths in rows:
      for name, call in calls.items():
        answers = {}
        for on in (False, True):
          t0 = time.perf_counter()
          answers[on], n_steps = call(prompt, lengths, **(option if on else {}))
          walls[name, on] += time.perf_counter() - t0
          tokens[name, on] += len(answers[on])
          steps[name, on] += n_steps
        if answers[True] != answers[False]:
          raise SystemExit(f"{name}: the run with --option {args.option} returned other tokens")
        if "stop" in option and option["stop"].find(
            tokenizer.decode(answers[True], skip_special_tokens=True)) is not None:
          raise SystemExit(f"{name}: the answer holds the stop string {args.stop!r}; pick one "
                           "that is never met")

  results = []
  print(f"--option {args.option}")
  print(f"{'engine':<28}{'tok/s':>10}{'with it':>10}{'ratio':>8}{'ms/step added':>15}")
  for name in calls:
    base, with_option = (tokens[name, on] / walls[name, on] for on in (False, True))
    added_ms = 1e3 * (walls[name, True] - walls[name, False]) / steps[name, True]
    results.append({"engine": name, "tokens_per_s": round(base, 2),
                    "tokens_per_s_with_option": round(with_option, 2),
                    "ratio": round(with_option / base, 4),
                    "ms_added_per_step": round(added_ms, 3),
                    "steps": steps[name, True], "new_tokens": tokens[name, True],
                    "wall_s": round(walls[name, False], 3),
                    "wall_s_with_option": round(walls[name, True], 3)})
    print(f"{name:<28}{base:>10.1f}{with_option:>10.1f}{with_option / base:>8.3f}"
          f"{added_ms:>15.3f}")
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
      json.dump({"option": args.option, "target": args.target,
                 "backend": jax.default_backend(), "prompts": args.prompts,
                 "passes": args.passes, "max_new_tokens": args.max_new_tokens,
                 "stop": args.stop if "stop" in option else None,
                 "cpu_count": os.cpu_count(), "results": results}, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
