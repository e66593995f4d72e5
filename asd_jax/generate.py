"""`python -m asd_jax.generate`: generate text with plain or speculative decoding.

Examples:
  python -m asd_jax.generate --prompt "What is the capital of France?"
  python -m asd_jax.generate --pair smollm2-135m --prompt "..."   # target + its drafter, strict
  python -m asd_jax.generate --target path/to/hf_folder --prompt-ids 1,2,3 --json
  python -m asd_jax.generate --prompt "..." --draft smollm2-135m-standalone --rule asd --k 4
  python -m asd_jax.generate --prompt "..." --draft ngram+store --rule asd --asd-preset exploratory
  python -m asd_jax.generate --prompt "..." --draft self --rule strict      # self-draft check
  python -m asd_jax.generate --prompt "..." --draft DIR --tree 4,4,16 --rule asd
  python -m asd_jax.generate --prompt "..." --draft ngram --k 3 --stream   # print as it goes
  python -m asd_jax.generate --prompts-file questions.txt --draft ngram+store --json  # batched
  python -m asd_jax.generate --prompt "..." --stop '\\n\\n' --json   # end at a blank line
  python -m asd_jax.generate --prompt "..." --system "Answer in one word."
  python -m asd_jax.generate --pair smollm2-135m --prompt "..." --repetition-penalty 1.2
  python -m asd_jax.generate --pair smollm2-135m --prompt "..." --guided-json schema.json  # JSON
  python -m asd_jax.generate --prompt "Is Paris in France?" --guided-choice yes --guided-choice no
  python -m asd_jax.generate --prompt "..." --bad-words "as an AI"

Without --draft: plain decoding. With --draft: --rule strict (default; output == plain greedy),
asd (--asd-preset, --budget/--gate/--max-exceptions; greedy only) or sample (lossless, uses
--temperature). --prompts-file answers many prompts, --batch-size rows at a time (a
greedy row decodes as it would alone). Without --k a shipped drafter drafts at the K its
benchmarks ran it at on this backend (models/drafter_setup.BENCHMARKED_K), any other at 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
from pathlib import Path

import jax
import numpy as np

from asd_jax.cli_common import (GUIDE_KINDS, MAX_SAMPLES, attach_dash_values, check_positive_flags,
                                enable_compilation_cache, parse_prompt_ids, read_prompts_file,
                                right_pad, run_cli, text_stream)
from asd_jax.asd_config import PRESETS, preset_with
from asd_jax.logit_edits import check_min_tokens_fit
from asd_jax.plain_decode import plain_decode
from asd_jax.request_checks import check_prompts
from asd_jax.sampling import SamplingConfig
from asd_jax.draft_tree import TreeShape
from asd_jax.spec_decode import RULES
from asd_jax.stop_strings import StopStrings
from asd_jax.token_logprobs import check_logprobs_request
from configs.model_pairs import apply_pair

# --prompts-file rows per decode call. On two CPU cores (bench --batch-size 1 vs 8, 8 MT-Bench
# prompts, 64 tokens; README "Generate"), 8 rows ran plain decoding at 1.27x the tokens/s of one
# row, but the n-gram store's strict rows at 0.65x: a round verifies K + 1 positions per row,
# and 8 rows of that are arithmetic the cores do not have spare. So speculative rows go one at
# a time unless --batch-size says otherwise (accelerators: not measured).
BATCH_SIZE = {"plain": 8, "speculative": 1}


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m asd_jax.generate", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--target", default="smollm2-135m",
                 help="HF folder, GGUF file, or a known name (default: smollm2-135m)")
  p.add_argument("--pair", help="a named model pair (configs/model_pairs.py, e.g. smollm2-135m): "
                 "sets --target and --draft")
  src = p.add_mutually_exclusive_group(required=True)
  src.add_argument("--prompt", help="user message; the chat template is applied")
  src.add_argument("--prompt-ids", help="raw comma-separated token ids, no template")
  src.add_argument("--prompts-file", help="user messages, one per line (or a .jsonl file of "
                   '{"prompt": ..., "stop": [...]} objects, or {"messages": [{"role": ..., '
                   '"content": ...}, ...]} for a conversation; optional: "stop", that answer\'s '
                   'stop strings, added to --stop\'s, "stop_token_ids" and "bad_words", added '
                   'to the flags\', and its own "max_new_tokens", "seed", "ignore_eos", "n", '
                   '"include_stop_str_in_output", "guided_json" / "guided_regex" / '
                   '"guided_choice" and sampling settings, e.g. "temperature", "min_tokens", '
                   '"logit_bias"); the chat template is applied to each')
  p.add_argument("--system", metavar="TEXT", help="system message placed before each prompt "
                 "(replaces the chat template's default one, e.g. SmolLM2's)")
  p.add_argument("--batch-size", type=int,
                 help=f"rows decoded together with --prompts-file (default "
                 f"{BATCH_SIZE['plain']} for plain decoding, {BATCH_SIZE['speculative']} with a "
                 "drafter: measured fastest on a CPU)")
  p.add_argument("--max-new-tokens", type=int, default=128)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  p.add_argument("--top-k", type=int, default=0, help="0 = off")
  p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
  p.add_argument("--min-p", type=float, default=0.0,
                 help="0 = off; drop tokens less likely than MIN_P times the likeliest")
  p.add_argument("--repetition-penalty", type=float, default=1.0,
                 help="1.0 = off; > 1 makes tokens already in the prompt or answer less likely "
                 "(a logit z > 0 is divided by it, one below 0 multiplied), in greedy decoding "
                 "too; every --rule and --draft gives the output plain decoding gives with it")
  p.add_argument("--presence-penalty", type=float, default=0.0,
                 help="0 = off; in [-2, 2]: subtracted from the logit of each token already in "
                 "the answer")
  p.add_argument("--frequency-penalty", type=float, default=0.0,
                 help="0 = off; in [-2, 2]: times the number of times a token is already in "
                 "the answer, subtracted from its logit")
  p.add_argument("--min-tokens", type=int, default=0,
                 help="0 = off; no EOS (nor stop string) ends an answer before it has this many "
                 "tokens")
  p.add_argument("--logit-bias", action="append", metavar="ID=BIAS",
                 help="add BIAS (in [-100, 100]; -100 bans the token in practice) to token ID's "
                 "logit, in greedy decoding too (repeatable)")
  p.add_argument("--allowed-token-ids", metavar="IDS",
                 help="comma-separated token ids: the only ones an answer may hold (vLLM's "
                 "allowed_token_ids; list an EOS id too, or answers end only at their length)")
  p.add_argument("--seed", type=int, default=0,
                 help="sampling seed; with --prompts-file or --n, answer i (from 0) samples with "
                 "seed + i, so each answer is the one it gets alone with that seed, in any batch")
  p.add_argument("--n", type=int, default=1,
                 help="answers per prompt (vLLM's n): N samples, as if each prompt were given N "
                 "times (seeds included); needs --temperature > 0")
  p.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens")
  p.add_argument("--stop-token-ids", metavar="IDS",
                 help="comma-separated token ids that end an answer too, like EOS (kept in "
                 "it; held back by --min-tokens; they stop it even with --ignore-eos)")
  p.add_argument("--include-stop-str", action="store_true",
                 help="show an answer's text through the stop string that ended it (vLLM's "
                 "include_stop_str_in_output), not up to it")
  p.add_argument("--stop", action="append", metavar="TEXT",
                 help="end an answer once its text contains TEXT (repeatable); the answer is "
                 "shown up to it (the tokens through the one that completes it). \\n, \\t "
                 "and \\\\ read as newline, tab and backslash")
  p.add_argument("--bad-words", action="append", metavar="TEXT",
                 help="text an answer may not hold (vLLM's bad_words; repeatable): the token "
                 "that would complete it is never chosen, in greedy decoding too (the word as "
                 "the tokenizer writes it at the start of a text and after a space; only the "
                 "answer's own tokens count). \\n, \\t and \\\\ read as with --stop")
  guided = p.add_mutually_exclusive_group()
  guided.add_argument("--guided-json", metavar="SCHEMA",
                      help="structured output (vLLM's guided_json): every answer is a JSON "
                      "document valid under this JSON schema (its text, or a .json file "
                      "holding it), as outlines-core writes it as a regular expression")
  guided.add_argument("--guided-regex", metavar="REGEX",
                      help="structured output (vLLM's guided_regex): every answer is a whole "
                      "match of REGEX (Rust regex syntax)")
  guided.add_argument("--guided-choice", action="append", metavar="TEXT",
                      help="structured output (vLLM's guided_choice): every answer is one of "
                      "these texts (repeatable)")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                 help="parameter/activation dtype (float32 on CPU, bfloat16 on TPU/GPU)")
  p.add_argument("--weight-blocks", action=argparse.BooleanOptionalAction, default=True,
                 help="compute with a GGUF target's Q4_1/Q8_0 blocks on the CPU (the same "
                 "weights and results at a fifth of the bytes; default) or its float32 copy only")
  p.add_argument("--json", action="store_true", help="print one JSON object")
  p.add_argument("--logprobs", action="store_true",
                 help="with --json: each answer's token log-probabilities under the target "
                 "(raw logits, before temperature; from the verify forwards, no extra cost in "
                 "forwards)")
  p.add_argument("--top-logprobs", type=int, default=0, metavar="L",
                 help="with --logprobs: also the target's L most likely tokens at each output "
                 "position, with their log-probabilities (most likely first)")
  p.add_argument("--prompt-logprobs", type=int, metavar="L",
                 help="with --json: each prompt token's log-probability under the target given "
                 "the tokens before it (vLLM's prompt_logprobs; the first is null), and with L "
                 "> 0 the target's L likeliest tokens there too; costs one more pass over the "
                 "prompt (0 = just the prompt tokens' own)")
  p.add_argument("--stream", action="store_true",
                 help="print the answer as it is generated (tokens/s then include the printing)")
  spec = p.add_argument_group("speculative decoding")
  spec.add_argument("--draft", help="drafter: a known name, a drafter folder, 'ngram' / "
                    "'ngram:MAX' / 'ngram:MIN-MAX' (model-free n-gram lookup in the prompt and "
                    "output; '+store' adds the target's shipped n-gram store as a fallback), "
                    "or 'self' (the target drafts for itself; a correctness check, "
                    "not a speedup)")
  spec.add_argument("--rule", choices=RULES, help="verification rule (default: strict with a "
                    "draft; plain decoding without)")
  spec.add_argument("--drafter", choices=("standalone", "eagle3", "medusa", "ngram"),
                    help="drafter kind (default: read from the drafter folder's config.json)")
  spec.add_argument("--k", type=int, help="draft block length K of a chain (default: the "
                    "K the drafter was benchmarked at on this backend, else 4)")
  spec.add_argument("--tree", help="DEPTH,TOPK,NODES: tree drafting (EAGLE-2 dynamic trees; "
                    "Medusa static trees); chain drafting when absent")
  presets = ", ".join(f"{name} (B={c.budget:g}, g={c.gate:g}, M={c.max_exceptions})"
                      for name, c in PRESETS.items())
  spec.add_argument("--asd-preset", metavar="NAME",
                    help=f"ASD settings (default paper): {presets}; the flags below replace "
                    "one value each")
  spec.add_argument("--budget", type=float, help="ASD regret budget B")
  spec.add_argument("--gate", type=float, help="ASD local gate g")
  spec.add_argument("--max-exceptions", type=int, help="ASD per-block exception cap M")
  spec.add_argument("--normalize-q", action="store_true", default=None,
                    help="ASD q = (K - i) / K")
  return p


ASD_FLAGS = (("--asd-preset", "asd_preset"), ("--budget", "budget"), ("--gate", "gate"),
             ("--max-exceptions", "max_exceptions"), ("--normalize-q", "normalize_q"))


def check_asd_flags_apply(args) -> None:
  """An ASD setting only acts under --rule asd; given with any other rule it would be ignored
  without a word, so it is refused."""
  given = [flag for flag, field in ASD_FLAGS if getattr(args, field) is not None]
  if given and args.rule != "asd":
    now = f"--rule {args.rule}" if args.rule else (
        "the default --rule strict" if args.draft else "plain decoding (no --draft)")
    raise ValueError(f"{given[0]} sets the ASD rule, which this run does not use ({now}); "
                     "pass --draft and --rule asd, or drop it")


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def parse_stop(values: list[str] | None, flag: str = "--stop") -> tuple[str, ...]:
  """--stop (or --bad-words) values with \\n, \\t and \\\\ read as escapes (a shell passes a
  typed \\n as two characters, and a stop at a blank line is the common case); any other
  backslash stays."""
  if not values:
    return ()
  strings = tuple(re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], v) for v in values)
  if "" in strings:
    raise ValueError(f"{flag} '' would end every answer before its first token; give the text "
                     "to stop at" if flag == "--stop" else
                     f"{flag} '' would ban nothing; give the text an answer may not hold")
  return strings


def parse_logit_bias(values: list[str] | None) -> dict[int, float]:
  """--logit-bias ID=BIAS values as {id: bias} (SamplingConfig checks the ranges)."""
  bias = {}
  for value in values or ():
    token, sep, amount = value.partition("=")
    try:
      token, amount = int(token), float(amount)
    except ValueError:
      raise ValueError(f"--logit-bias takes ID=BIAS, e.g. 2=-100, got {value!r}") from None
    if not sep:
      raise ValueError(f"--logit-bias takes ID=BIAS, e.g. 2=-100, got {value!r}")
    if token in bias:
      raise ValueError(f"--logit-bias names token {token} twice")
    bias[token] = amount
  return bias


def line_samplings(base: SamplingConfig, lines, path: str) -> list[SamplingConfig]:
  """Each prompts-file line's SamplingConfig: the flags' with the line's own fields in place of
  theirs; a bad value names its line."""
  samplings = []
  for number, line in enumerate(lines, 1):
    try:
      samplings.append(dataclasses.replace(base, **line.sampling))
    except ValueError as e:
      raise ValueError(f"--prompts-file {path}: line {number}: {e}") from None
  return samplings


def per_line(path: str | None, rows, build) -> list:
  """build(*row) for each request's row of values; a refusal names its prompts-file line."""
  out = []
  for number, row in enumerate(rows, 1):
    try:
      out.append(build(*row))
    except ValueError as e:
      raise ValueError(f"--prompts-file {path}: line {number}: {e}" if path else str(e)) from None
  return out


def with_bad_words(samplings, tokenizer, words, vocab_size: int,
                   path: str | None) -> list[SamplingConfig]:
  """Each request's SamplingConfig with its bad words (text) as token sequences
  (models.tokenizer.bad_words_ids), checked before any row decodes (too many words, or words
  that ban every allowed id); a refusal names its line."""
  from models.tokenizer import bad_words_ids

  def build(own, texts):
    if texts:
      own = dataclasses.replace(own, bad_words_ids=bad_words_ids(tokenizer, texts))
      own.logit_edits(vocab_size)
    return own
  return per_line(path, zip(samplings, words), build)


def guide_request(args, lines, path: str | None) -> list:
  """Each request's structured-output request as (kind, value) or None: a .jsonl line's own
  "guided_json", "guided_regex" or "guided_choice" (one of them) in place of the flags'. The
  schema is read and parsed here, before any model loads."""
  flag = next(((kind, getattr(args, f"guided_{kind}")) for kind in GUIDE_KINDS
               if getattr(args, f"guided_{kind}") is not None), None)
  if flag is not None and flag[0] == "json":
    flag = ("json", read_schema(flag[1], "--guided-json"))
  if lines is None:
    return [flag]
  return [flag if line.guide is None else line.guide for line in lines]


def read_schema(value: str, where: str):
  """A JSON schema given as its text or as the path of a .json file holding it."""
  text = value
  if not value.lstrip().startswith("{") and Path(value).is_file():
    text = Path(value).read_text(encoding="utf-8")
  try:
    schema = json.loads(text)
  except ValueError as e:
    raise ValueError(f"{where}: not a JSON schema (its JSON text or a .json file): {e}") from None
  if not isinstance(schema, dict):
    raise ValueError(f"{where}: a JSON schema is a JSON object, got {schema!r}")
  return schema


def with_guides(samplings, tokenizer, requests, vocab_size: int, eos_rows,
                path: str | None) -> list[SamplingConfig]:
  """Each request's SamplingConfig with its TokenGuide (one per distinct request), checked
  against its EOS ids before any row decodes; a refusal names its line."""
  from asd_jax.token_guide import TokenGuide
  build = {"json": TokenGuide.from_json_schema, "regex": TokenGuide.from_regex,
           "choice": TokenGuide.from_choice}
  guides, checked = {}, set()

  def with_guide(own, request, eos):
    if request is not None:
      key = json.dumps(request, sort_keys=True)
      if key not in guides:
        guides[key] = build[request[0]](request[1], tokenizer, vocab_size)
      own = dataclasses.replace(own, guide=guides[key])
      # The check builds the guide's device table (tens of MB): once per distinct request.
      if (own, eos) not in checked:
        own.logit_edits(vocab_size, eos)
        checked.add((own, eos))
    return own
  return per_line(path, zip(samplings, requests, eos_rows), with_guide)


def line_values(lines, field: str, flag_value) -> list:
  """Each request's value of a setting a .jsonl line may give: its line's own `field` where
  set (not None), else the flag's (one request without a prompts file)."""
  if lines is None:
    return [flag_value]
  return [flag_value if getattr(line, field) is None else getattr(line, field) for line in lines]


def finish_reason(tokens: list[int], raw_text: str, eos, stop, nonfinite: bool,
                  stop_after: int = 0, stop_token_ids=()) -> str:
  """Why an answer ended: stop (one of its stop strings, ending past its first stop_after
  characters: StopStrings.min_tokens_chars, or one of its stop_token_ids), eos, nonfinite
  (NaN/inf logits) or length."""
  if stop is not None and stop.find(raw_text, stop_after) is not None:
    return "stop"
  if tokens and tokens[-1] in stop_token_ids:
    return "stop"
  if tokens and tokens[-1] in eos:
    return "eos"
  return "nonfinite" if nonfinite else "length"


def json_logprobs(values) -> list:
  """Log-probabilities as the JSON shows them: 5 decimals, rounded as float64 (float32 values
  would print as -0.019670000299811363), and null where one is not finite (NaN logits; json
  would write NaN, which is not JSON)."""
  rounded = np.asarray(values, np.float64).round(5)
  shown = rounded.astype(object)
  shown[~np.isfinite(rounded)] = None
  return shown.tolist()


def top_candidates(tokenizer, ids_NxL, logprobs_NxL) -> list[list[dict]]:
  """Each output position's top-L list as the JSON shows it: every candidate's id, its text
  decoded alone (OpenAI's `token`; a piece of a multi-byte character reads U+FFFD) and its
  log-probability, most likely first."""
  ids = np.asarray(ids_NxL).tolist()
  texts = {i: tokenizer.decode([i]) for i in {i for row in ids for i in row}}
  return [[{"id": i, "token": texts[i], "logprob": lp} for i, lp in zip(row_ids, row_lps)]
          for row_ids, row_lps in zip(ids, json_logprobs(logprobs_NxL))]


# The keys --prompt-logprobs adds to each answer (score_prompts).
PROMPT_KEYS = ("prompt_token_ids", "prompt_logprobs", "prompt_top_logprobs",
               "prompt_nonfinite_logits")


def score_prompts(fns, params, tokenizer, rows: list[list[int]], top: int,
                  batch_size: int) -> list[dict]:
  """--prompt-logprobs: each prompt's token ids (after the chat template: what was scored), its
  tokens' log-probabilities (null first: nothing precedes it to predict it, and null where the
  logits were not finite) and, with top > 0, the likeliest `top` tokens at each position."""
  from asd_jax.prompt_logprobs import prompt_logprobs
  scored = []
  for start in range(0, len(rows), batch_size):
    batch = rows[start:start + batch_size]
    prompt, lengths = right_pad(batch)
    result = jax.device_get(prompt_logprobs(fns, params, prompt, lengths, top_logprobs=top))
    for b, row in enumerate(batch):
      n = len(row)
      entry = {"prompt_token_ids": list(row),
               "prompt_logprobs": [None] + json_logprobs(result.logprobs_BxT[b, 1:n]),
               "prompt_nonfinite_logits": bool(result.nonfinite_B[b])}
      if top:
        entry["prompt_top_logprobs"] = [None] + top_candidates(
            tokenizer, result.top_token_ids_BxTxL[b, 1:n], result.top_logprobs_BxTxL[b, 1:n])
      scored.append(entry)
  return scored


def check_rows_fit(rows: list[list[int]], max_new: list[int], max_positions: int | None,
                   path: str) -> None:
  """Every prompt of a file is checked before the first batch decodes, so a long one on line 90
  does not throw away the answers of lines 1-89; the error names the lines. max_new: each
  row's max_new_tokens."""
  if max_positions is None:
    return
  over = [i + 1 for i, (r, n) in enumerate(zip(rows, max_new)) if len(r) + n > max_positions]
  if over:
    longest = max(len(rows[i - 1]) for i in over)
    most = max(max_new[i - 1] for i in over)
    raise ValueError(f"--prompts-file {path}: prompt(s) on line(s) "
                     f"{', '.join(map(str, over[:10]))}{' ...' if len(over) > 10 else ''} "
                     f"(up to {longest} tokens) + max_new_tokens (up to {most}) exceed the "
                     f"context window ({max_positions} positions); shorten them or lower "
                     "--max-new-tokens or the lines' \"max_new_tokens\"")


@run_cli
def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  parser = build_parser()
  args = parser.parse_args(attach_dash_values(argv, ("--prompt-ids",)))
  apply_pair(args, parser)
  sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                            min_p=args.min_p, repetition_penalty=args.repetition_penalty,
                            presence_penalty=args.presence_penalty,
                            frequency_penalty=args.frequency_penalty,
                            min_tokens=args.min_tokens,
                            logit_bias=parse_logit_bias(args.logit_bias),
                            allowed_token_ids=None if args.allowed_token_ids is None else
                            parse_prompt_ids(args.allowed_token_ids, "--allowed-token-ids"))
  check_positive_flags(args, "max_new_tokens")
  if args.prompt is not None and not args.prompt.strip():
    raise ValueError("empty prompt: --prompt is blank")
  # Every flag is checked before the (slow) model load, so a typo fails in milliseconds.
  ids = parse_prompt_ids(args.prompt_ids) if args.prompt_ids is not None else None
  stop_ids = (() if args.stop_token_ids is None
              else tuple(parse_prompt_ids(args.stop_token_ids, "--stop-token-ids")))
  stop_strings = parse_stop(args.stop)
  bad_words = parse_stop(args.bad_words, "--bad-words")
  if args.guided_choice is not None and "" in args.guided_choice:
    raise ValueError("--guided-choice '' is an empty answer; give the texts an answer may be")
  lines = read_prompts_file(args.prompts_file) if args.prompts_file else None
  messages = None if lines is None else [line.message for line in lines]
  if args.system is not None:
    if ids is not None:
      raise ValueError("--system is a chat message; --prompt-ids are raw ids without the chat "
                       "template, so put the system turn in the ids or drop --system")
    from models.tokenizer import chat_messages  # each request with it, checked before the load
    for number, message in enumerate([args.prompt] if messages is None else messages, 1):
      chat_messages(message, args.system, "--system" if messages is None else
                    f"--prompts-file {args.prompts_file}: line {number}")
  if not 1 <= args.n <= MAX_SAMPLES:
    raise ValueError(f"--n must be in [1, {MAX_SAMPLES}], got {args.n}")
  # Each prompt's number of answers: a .jsonl line's own "n", else --n.
  copies = line_values(lines, "n", args.n)
  if messages is None and args.batch_size is not None and args.n == 1:
    raise ValueError("--batch-size sets the rows decoded together from --prompts-file or "
                     "--n; pass one of them or drop it")
  batch_size = (BATCH_SIZE["plain" if args.draft is None else "speculative"]
                if args.batch_size is None else args.batch_size)
  if batch_size <= 0:
    raise ValueError(f"--batch-size must be a positive integer, got {batch_size}")
  if (messages is not None or args.n > 1) and args.stream:
    raise ValueError("--stream prints one answer as it arrives; use it with --prompt, not "
                     "--prompts-file or --n")
  if args.draft is None and args.rule is not None:
    raise ValueError(f"--rule {args.rule} needs a drafter: pass --draft")
  if args.k is not None and args.k <= 0:
    raise ValueError(f"--k must be a positive integer, got {args.k}")
  if args.logprobs and not args.json:
    raise ValueError("--logprobs adds each token's log-probability to the --json output; "
                     "pass --json")
  if args.top_logprobs < 0:
    raise ValueError(f"--top-logprobs must be >= 0, got {args.top_logprobs}")
  if args.top_logprobs and not args.logprobs:
    raise ValueError("--top-logprobs lists the likeliest tokens beside each token's own "
                     "log-probability; pass --logprobs (and --json)")
  if args.prompt_logprobs is not None:
    if not args.json:
      raise ValueError("--prompt-logprobs adds each prompt token's log-probability to the --json "
                       "output; pass --json")
    if args.prompt_logprobs < 0:
      raise ValueError(f"--prompt-logprobs must be >= 0, got {args.prompt_logprobs}")
  if args.stream and args.json:
    raise ValueError("--stream prints text as it arrives; it cannot be combined with --json")
  asd_config = preset_with(args.asd_preset or "paper", budget=args.budget, gate=args.gate,
                           max_exceptions=args.max_exceptions, normalize_q=args.normalize_q)
  check_asd_flags_apply(args)
  tree = None if args.tree is None else TreeShape.parse(args.tree)  # "" is a typo, not "chain"
  if tree is not None and args.k is not None:
    raise ValueError(f"--k sets a chain's length; with --tree {args.tree} the tree's DEPTH is "
                     "the draft length, so drop --k")
  if args.draft is not None:
    from models.drafter_setup import check_drafter_request
    check_drafter_request(args.draft, args.drafter, tree)
  # The answers in order: answer r is sample sample_of[r] of prompt prompt_of[r] (the prompts
  # written copies[i] times each).
  prompt_of = [i for i, c in enumerate(copies) for _ in range(c)]
  sample_of = [j for c in copies for j in range(c)]
  # Each answer's sampling seed: its .jsonl line's own + its sample index, else --seed + its
  # index among the answers (row_keys takes uint32 seeds, so they must stay below 2**32).
  own_seeds = line_values(lines, "seed", None)
  seeds = [args.seed + r if own_seeds[i] is None else own_seeds[i] + j
           for r, (i, j) in enumerate(zip(prompt_of, sample_of))]
  last = max((r for r, i in enumerate(prompt_of) if own_seeds[i] is None), default=0)
  if not 0 <= args.seed <= 2**32 - 1 - last:
    raise ValueError(f"--seed must be in [0, 2**32), got {args.seed}" if last == 0 else
                     f"--seed {args.seed}: answer i samples with seed + i, so with "
                     f"{last + 1} answers --seed must be in [0, {2**32 - 1 - last}]")
  for i, (first, c) in enumerate(zip(own_seeds, copies)):
    if first is not None and first + c - 1 > 2**32 - 1:
      raise ValueError(f"--prompts-file {args.prompts_file}: line {i + 1}: its {c} samples "
                       f"draw with seeds {first}..{first + c - 1}, past 2**32 - 1")
  # Each answer's max_new_tokens: a .jsonl line's own, else --max-new-tokens; the decode calls
  # all take the largest (one output buffer size), and each row stops at its own.
  max_new = line_values(lines, "max_new_tokens", args.max_new_tokens)
  longest_answer = max(max_new)
  # Each answer's stop token ids (--stop-token-ids', plus its .jsonl line's own) and whether it
  # ignores EOS (a line's own "ignore_eos", else --ignore-eos).
  row_stop_ids = [stop_ids] if lines is None else [
      tuple(dict.fromkeys(stop_ids + line.stop_token_ids)) for line in lines]
  row_ignore_eos = line_values(lines, "ignore_eos", args.ignore_eos)
  row_include_stop = line_values(lines, "include_stop", args.include_stop_str)
  # Each answer's sampling settings: the flags', or a .jsonl line's own in place of them.
  samplings = [sampling] if lines is None else line_samplings(sampling, lines, args.prompts_file)
  # Each answer's structured output (a line's own, else the flags'), as (kind, value) or None.
  guide_requests = guide_request(args, lines, args.prompts_file)
  for i, (own, n) in enumerate(zip(samplings, max_new)):
    where = "" if lines is None else f"--prompts-file {args.prompts_file}: line {i + 1}: "
    try:
      check_min_tokens_fit(own.min_tokens, n)
    except ValueError as e:
      raise ValueError(f"{where}{e}") from None
    if args.draft is not None and (args.rule or "strict") in ("strict", "asd") and not own.greedy:
      raise ValueError(f"{where}--rule {args.rule or 'strict'} is greedy verification; "
                       f"temperature {own.temperature} needs --rule sample (or temperature 0)")
    if copies[i] > 1 and own.greedy:
      raise ValueError(f"{where}n={copies[i]} asks for {copies[i]} samples, but temperature 0 "
                       "is greedy decoding: every one would be the same answer; set a "
                       "temperature > 0")
  from models.registry import peek_vocab_size
  vocab_size = peek_vocab_size(args.target)  # refuses an empty or unknown --target too
  if vocab_size is not None:  # the decode checks these again; here they cost no model load
    if ids is not None:
      check_prompts(np.array([ids]), np.array([len(ids)]), vocab_size)
    check_logprobs_request(args.logprobs, args.top_logprobs, vocab_size)
    if args.prompt_logprobs is not None:
      check_logprobs_request(True, args.prompt_logprobs, vocab_size)
    for own in set(samplings):
      own.logit_edits(vocab_size)  # a logit_bias or allowed_token_ids id past the vocabulary
    for i, own_ids in enumerate(row_stop_ids):
      outside = [t for t in own_ids if t >= vocab_size]
      if outside:
        where = ("--stop-token-ids" if outside[0] in stop_ids else
                 f"--prompts-file {args.prompts_file}: line {i + 1}: stop_token_ids")
        raise ValueError(f"{where}: token id {outside[0]} is outside the vocabulary "
                         f"[0, {vocab_size})")
  enable_compilation_cache()

  from models.load import load_decoder
  from models.lm_fns import decoder_fns
  from models.tokenizer import check_tokenizer_fits, encode_chat, eos_token_ids, load_tokenizer

  t0 = time.perf_counter()
  loaded = load_decoder(args.target, dtype=args.dtype, weight_blocks=args.weight_blocks)
  tokenizer = load_tokenizer(args.target)
  check_tokenizer_fits(tokenizer, loaded.model.cfg.vocab_size, args.target)
  load_s = time.perf_counter() - t0
  if messages is not None:
    rows = [encode_chat(tokenizer, m, args.system) for m in messages]
  else:
    rows = [ids if ids is not None else encode_chat(tokenizer, args.prompt, args.system)]
  # Each answer's ids that end it: the model's EOS unless it ignores them, and its stop ids.
  model_eos = eos_token_ids(tokenizer, loaded.hf_config)
  row_eos = [tuple(dict.fromkeys((() if ignore else model_eos) + own_ids))
             for ignore, own_ids in zip(row_ignore_eos, row_stop_ids)]
  fns, params = decoder_fns(loaded.model, name=args.target)
  if messages is not None:
    check_rows_fit(rows, max_new, fns.max_positions, args.prompts_file)
  # Each answer's stop strings: --stop's, plus its .jsonl line's own (one StopStrings per set).
  wanted = [stop_strings] if lines is None else [
      tuple(dict.fromkeys(stop_strings + line.stop)) for line in lines]
  stop_sets = {s: StopStrings.from_tokenizer(tokenizer, s) for s in set(wanted) if s}
  row_stop = [stop_sets.get(s) for s in wanted]
  # Each answer's bad words: --bad-words', plus its .jsonl line's own, as token sequences.
  samplings = with_bad_words(samplings, tokenizer, [bad_words] if lines is None else [
      tuple(dict.fromkeys(bad_words + line.bad_words)) for line in lines], fns.vocab_size,
      args.prompts_file)
  samplings = with_guides(samplings, tokenizer, guide_requests, fns.vocab_size, row_eos,
                          args.prompts_file)
  t0 = time.perf_counter()
  scored_prompts = (None if args.prompt_logprobs is None else
                    score_prompts(fns, params, tokenizer, rows, args.prompt_logprobs,
                                  batch_size))
  score_s = time.perf_counter() - t0  # not in wall_s: that is the decoding's
  if len(prompt_of) > len(copies):  # from here on, one row per answer
    rows, max_new, samplings, row_eos, row_stop_ids, row_stop, row_include_stop = (
        [per_prompt[i] for i in prompt_of] for per_prompt in (
            rows, max_new, samplings, row_eos, row_stop_ids, row_stop, row_include_stop))
  stream = (text_stream(tokenizer, stop=row_stop[0], min_tokens=sampling.min_tokens)
            if args.stream else None)

  if args.draft is None:
    stats = {"mode": "plain"}

    def decode(prompt, lengths, stop, seeds, max_new_B, sampling, eos):
      return plain_decode(fns, params, prompt, lengths, max_new_tokens=longest_answer,
                          max_new_B=max_new_B, eos_ids=eos, sampling=sampling, seed=seeds,
                          stream=stream,
                          stop=stop, logprobs=args.logprobs, top_logprobs=args.top_logprobs)
  else:
    rule = args.rule or "strict"
    from models.drafter_setup import default_k, setup_drafter
    k = args.k or default_k(args.draft, jax.default_backend())
    setup = setup_drafter(args.draft, loaded, k=k, tree=tree, kind=args.drafter,
                          dtype=args.dtype, target_name=args.target)
    stats = {"mode": "speculative", "rule": rule, "k": None if tree else k, "draft": args.draft,
             "drafter": setup.kind, "engine": setup.engine, "tree": args.tree}
    if rule == "asd":
      stats["asd_config"] = {"preset": args.asd_preset or "paper", "budget": asd_config.budget,
                             "gate": asd_config.gate, "max_exceptions": asd_config.max_exceptions,
                             "normalize_q": asd_config.normalize_q}

    def decode(prompt, lengths, stop, seeds, max_new_B, sampling, eos):
      return setup.decode(setup.target_fns, setup.target_params, setup.drafter, setup.params,
                          prompt, lengths, max_new_tokens=longest_answer,
                          max_new_B=max_new_B, rule=rule,
                          asd_config=asd_config, sampling=sampling, eos_ids=eos,
                          seed=seeds, stream=stream, stop=stop, logprobs=args.logprobs,
                          top_logprobs=args.top_logprobs)

  answers, results = [None] * len(rows), []
  t0 = time.perf_counter()
  # Rows of any settings decode together, --batch-size at a time in file order: the engines
  # take one SamplingConfig and one set of EOS ids per row.
  batches = [list(range(start, min(start + batch_size, len(rows))))
             for start in range(0, len(rows), batch_size)]
  for batch in batches:
    prompt, lengths = right_pad([rows[i] for i in batch])
    batch_stop = [row_stop[i] for i in batch]
    # Prompt i samples with its own seed whatever its batch: one seed for the whole batch would
    # give each row the stream of its place in the batch, so the answers would change with
    # --batch-size and prompts at the same place in different batches would draw alike.
    result = jax.block_until_ready(decode(prompt, lengths, batch_stop,
                                          np.array([seeds[i] for i in batch]),
                                          np.array([max_new[i] for i in batch], np.int32),
                                          [samplings[i] for i in batch],
                                          [row_eos[i] for i in batch]))
    results.append(result)
    for b, (i, stop) in enumerate(zip(batch, batch_stop)):
      n = int(result.num_generated_B[b])
      tokens = np.asarray(result.tokens_BxN[b, :n]).tolist()
      text = tokenizer.decode(tokens, skip_special_tokens=True)
      nonfinite = bool(result.nonfinite_B[b])
      stop_after = 0 if stop is None else stop.min_tokens_chars(tokens, samplings[i].min_tokens)
      answer = {"tokens": tokens,
                "text": text if stop is None else stop.cut(text, stop_after, row_include_stop[i]),
                "finish_reason": finish_reason(tokens, text, row_eos[i], stop, nonfinite,
                                               stop_after,
                                               row_stop_ids[i]),
                "nonfinite_logits": nonfinite}
      if args.logprobs:
        answer["logprobs"] = json_logprobs(result.logprobs_BxN[b, :n])
      if args.top_logprobs:
        answer["top_logprobs"] = top_candidates(
            tokenizer, result.top_token_ids_BxNxL[b, :n], result.top_logprobs_BxNxL[b, :n])
      if scored_prompts is not None:
        answer.update(scored_prompts[prompt_of[i]])
      answers[i] = answer
  wall_s = time.perf_counter() - t0  # includes compilation unless the persistent cache had it
  if args.draft is None:
    forwards = np.concatenate([np.asarray(r.target_forwards_B) for r in results])
    stats.update(target_forwards=int(forwards.sum()), tau=1.0)
    per_row = [{"target_forwards": int(f)} for f in forwards]
  else:
    # One DecodeStats over every row: its summary pools the rounds of all batches.
    pooled = jax.tree.map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]),
                          *[r.stats for r in results])
    summary = pooled.summary()
    stats.update({key: summary[key] for key in ("rounds", "tau", "accepted_per_position")})
    per_row = [{"tau": summary["tau_per_row"][i], "rounds": int(pooled.rounds_B[i]),
                "asd_exceptions": summary["asd_exceptions"][i],
                "asd_spent": summary["asd_spent"][i]} for i in range(len(rows))]
  n_total = sum(len(a["tokens"]) for a in answers)
  stats.update({
      "prompt_tokens": sum(len(r) for r in rows),
      "new_tokens": n_total,
      "load_s": round(load_s, 3),
      "wall_s": round(wall_s, 3),
      **({} if scored_prompts is None else {"prompt_logprobs_s": round(score_s, 3)}),
      "tokens_per_s": round(n_total / wall_s, 2),
      "dtype": args.dtype,
      "backend": jax.default_backend(),
      "nonfinite_logits": any(a["nonfinite_logits"] for a in answers),
  })
  # One prompt, one answer: the answer's own object; else a list of answers.
  single = messages is None and len(answers) == 1
  if single:
    answer = answers[0]
    if args.draft is not None:  # the row's own ledger (plain's forwards are the total above)
      stats.update(asd_exceptions=per_row[0]["asd_exceptions"], asd_spent=per_row[0]["asd_spent"])
  else:
    stats.update(prompts=len(copies), batch_size=batch_size)
    prompts = messages or [args.prompt if ids is None else ids]
    for i, j, answer, row in zip(prompt_of, sample_of, answers, per_row):
      answer.update(prompt=prompts[i], new_tokens=len(answer["tokens"]), **row)
      if copies[i] > 1:
        answer["sample"] = j
  if args.json:
    print(json.dumps({"tokens": answer["tokens"], "text": answer["text"],
                      "finish_reason": answer["finish_reason"], "stats": stats,
                      **{key: answer[key] for key in ("logprobs", "top_logprobs", *PROMPT_KEYS)
                         if key in answer}}
                     if single else {"answers": answers, "stats": stats}))
  else:
    if single:
      if args.stream:
        stream.on_tokens.finish(answer["text"])  # what the stream held back at a stop's start
        print()
      else:
        print(answer["text"])
    else:
      shown = ([line.shown() for line in lines] if lines is not None else
               [args.prompt if ids is None else str(ids)])
      for r, (i, j, a) in enumerate(zip(prompt_of, sample_of, answers)):
        of = f" (sample {j + 1}/{copies[i]})" if copies[i] > 1 else ""
        print(f"### [{r + 1}/{len(answers)}] {shown[i]}{of}\n{a['text']}\n")
    print(f"\n[{n_total} tokens in {wall_s:.2f} s ({n_total / wall_s:.1f} tok/s incl. compile), "
          f"load {load_s:.2f} s]")
  if scored_prompts is not None:
    bad = [i + 1 for i, a in enumerate(scored_prompts) if a["prompt_nonfinite_logits"]]
    if bad:
      raise ValueError("the model produced non-finite logits scoring prompt(s) "
                       f"{', '.join(map(str, bad))} of {len(scored_prompts)}; their "
                       "prompt_logprobs there are null (the rest of the output above is complete)")
  bad = [i + 1 for i, a in enumerate(answers) if a["nonfinite_logits"]]
  if bad:  # after the output, so the tokens before the bad step are not lost
    where = (f"after {len(answers[0]['tokens'])} tokens" if single else
             f"in answer(s) {', '.join(map(str, bad))} of {len(answers)}")
    raise ValueError(f"the model produced non-finite logits {where}; generation stopped there "
                     "(the output above is complete up to that point)")


if __name__ == "__main__":
  main()
