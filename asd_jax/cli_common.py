"""Shared plumbing for the command-line tools: errors as one line, JAX setup, prompt encoding,
interleaved timing of warmed-up runs."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np


def run_cli(main):
  """Runs `main()`; a ValueError/TypeError/FileNotFoundError becomes a one-line error, exit 2."""

  @functools.wraps(main)
  def wrapper(argv=None):
    try:
      return main(argv)
    except (ValueError, TypeError, FileNotFoundError) as e:
      print(f"error: {e}", file=sys.stderr)
      raise SystemExit(2)

  return wrapper


COMPILATION_CACHE_ENV = "ASD_JAX_COMPILATION_CACHE"
COMPILATION_CACHE_MB_ENV = "ASD_JAX_COMPILATION_CACHE_MB"


def enable_compilation_cache() -> None:
  """Persists compiled programs across CLI runs (a second `generate` skips most compilation).

  ASD_JAX_COMPILATION_CACHE=0 leaves it off. The test suite sets that: the setting is
  process-wide, so one in-process CLI call would make every later compile in that pytest worker
  serialize its executable to disk.

  The folder is capped at ASD_JAX_COMPILATION_CACHE_MB (default 1024; a SmolLM2 decode loop is
  ~1 MB), least recently used programs going first. The cap also matters for correctness: only
  with a size limit does jax hold a file lock around each read and write (jax/_src/lru_cache.py),
  so two CLI runs at once cannot load a program the other is half-way through writing."""
  switch = os.environ.get(COMPILATION_CACHE_ENV, "1")
  if switch not in ("0", "1"):
    raise ValueError(f"{COMPILATION_CACHE_ENV} must be 0 or 1, got {switch!r}")
  if switch == "0":
    return
  megabytes = os.environ.get(COMPILATION_CACHE_MB_ENV, "1024")
  if not (megabytes.isdigit() and int(megabytes) > 0):
    raise ValueError(f"{COMPILATION_CACHE_MB_ENV} must be a whole number of megabytes above 0, "
                     f"got {megabytes!r} (to turn the cache off set {COMPILATION_CACHE_ENV}=0)")
  import jax
  from platformdirs import user_cache_dir

  root = os.environ.get("ASD_JAX_CACHE_DIR") or user_cache_dir("asd-jax")
  folder = os.path.join(root, "xla")
  _drop_unfinished_entries(folder)
  jax.config.update("jax_compilation_cache_dir", folder)
  jax.config.update("jax_compilation_cache_max_size", int(megabytes) << 20)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def _drop_unfinished_entries(folder: str) -> None:
  """Deletes cached programs that have no access-time file beside them.

  jax (jax/_src/lru_cache.py, which owns the `-cache`/`-atime` names and the lock file) writes
  a program and then its access time; a run killed in between, or a jax program using the
  folder without a size cap, leaves a program without one. Its eviction reads every entry's
  time before each write, so that one file made every later write fail (a warning each, no
  program cached again): jax-ml/jax#39880, fixed upstream by #39883 but not in jax 0.10.2,
  which this repo installs. Dropped rather than given a time: it may be cut short; it costs
  one compile."""
  import filelock
  if not os.path.isdir(folder):
    return
  try:
    lock = filelock.FileLock(os.path.join(folder, ".lockfile")).acquire(timeout=10)
  except filelock.Timeout:  # another run holds the folder; jax will wait for it too
    return
  with lock:
    for name in os.listdir(folder):
      key = name.removesuffix("-cache")
      if key != name and not os.path.exists(os.path.join(folder, f"{key}-atime")):
        with contextlib.suppress(FileNotFoundError):
          os.unlink(os.path.join(folder, name))


def check_output_path(path: str, flag: str, *, folder: bool = False) -> None:
  """Refuses now, not after the run, a place a file (or with `folder`, a folder) cannot be
  written: the wrong kind of thing already there, a file among its parents, or no write
  permission. Raises ValueError naming `flag`."""
  if not str(path).strip():
    raise ValueError(f"{flag} is empty; name the {'folder' if folder else 'file'} to write")
  target = Path(path).absolute()
  if target.exists() and target.is_dir() != folder:
    raise ValueError(f"{flag} {path} is a {'file' if folder else 'folder'}, not a "
                     f"{'folder' if folder else 'file'}")
  existing = next(a for a in (target, *target.parents) if a.exists())
  if existing != target and not existing.is_dir():
    raise ValueError(f"{flag} {path}: {existing} is a file, not a folder")
  if not os.access(existing, os.W_OK | (os.X_OK if existing.is_dir() else 0)):
    raise ValueError(f"{flag} {path}: {existing} is not writable")


def check_positive_flags(args, *names: str) -> None:
  """Refuses a zero or negative value of each named argparse option (dest names, e.g.
  'max_new_tokens' for --max-new-tokens): a count of 0 would run nothing, or divide by it.
  Raises ValueError naming the flag."""
  for name in names:
    value = getattr(args, name)
    if value <= 0:
      raise ValueError(f"--{name.replace('_', '-')} must be positive, got {value}")


def split_list_flag(text: str, flag: str) -> list[str]:
  """'a, b' -> ['a', 'b'] for a comma-separated option named `flag`.

  An empty field ('a,,b', 'a,') is refused rather than skipped: it is most likely an entry that
  went missing, and dropping it would silently run something other than what was asked."""
  fields = [f.strip() for f in text.split(",")]
  if "" in fields:
    raise ValueError(f"{flag} {text!r} has an empty entry; separate entries with single commas")
  return fields


def attach_dash_values(argv: list[str], flags: tuple[str, ...]) -> list[str]:
  """['--prompt-ids', '-1,5'] -> ['--prompt-ids=-1,5'] for each flag in `flags`.

  argparse takes a value starting with '-' for an option unless it is one plain negative
  number, so '-1,5' would end in "expected one argument". Attached to its flag, the value
  reaches the ids check, which names the bad id."""
  out: list[str] = []
  i = 0
  while i < len(argv):
    arg = argv[i]
    value = argv[i + 1] if i + 1 < len(argv) else ""
    if arg in flags and value[:1] == "-" and value[1:2].isdigit():
      out.append(f"{arg}={value}")
      i += 2
      continue
    out.append(arg)
    i += 1
  return out


def parse_prompt_ids(text: str, flag: str = "--prompt-ids") -> list[int]:
  """Comma-separated token ids (--prompt-ids, --stop-token-ids)."""
  if not text.strip():
    raise ValueError(f"{'empty prompt: ' if flag == '--prompt-ids' else ''}{flag} has no ids")
  fields = split_list_flag(text, flag)
  # int() of a field with a space inside fails, so '1 2,3' is refused rather than read as [12, 3].
  try:
    ids = [int(x) for x in fields]
  except ValueError:
    raise ValueError(f"{flag} must be comma-separated integers, got {text!r}") from None
  # The vocabulary check comes later (it needs the model's config); a negative id, or one past int32
  # (prompts are int32 arrays: NumPy would fail first, with a traceback), is outside any
  # vocabulary, so it is refused before a model is loaded.
  outside = [i for i in ids if not 0 <= i < 2**31]
  if outside:
    raise ValueError(f"{flag}: token id {outside[0]} is outside any vocabulary")
  return ids


@dataclasses.dataclass(frozen=True)
class PromptLine:
  """One request of a prompts file: the user message (or, from a .jsonl "messages", the
  conversation: a list of {"role", "content"} objects ending with the user's) and its own stop
  strings."""
  message: str | list[dict[str, str]]
  stop: tuple[str, ...] = ()
  max_new_tokens: int | None = None  # a .jsonl line's own; None: --max-new-tokens
  seed: int | None = None  # a .jsonl line's own sampling seed; None: --seed + its index
  # a .jsonl line's own SamplingConfig fields (SAMPLING_RECORD_KEYS), in place of the flags'
  sampling: dict = dataclasses.field(default_factory=dict)
  stop_token_ids: tuple[int, ...] = ()  # a .jsonl line's own, added to --stop-token-ids'
  ignore_eos: bool | None = None  # a .jsonl line's own; None: --ignore-eos
  n: int | None = None  # a .jsonl line's own number of samples; None: --n
  # a .jsonl line's own "include_stop_str_in_output"; None: --include-stop-str
  include_stop: bool | None = None
  bad_words: tuple[str, ...] = ()  # a .jsonl line's own "bad_words", added to --bad-words'
  # a .jsonl line's own structured output, ("json", schema), ("regex", text) or ("choice",
  # texts), in place of the --guided-* flags'; None: the flags'
  guide: tuple | None = None

  def shown(self) -> str:
    """What a text listing shows for the request: the message, or a conversation's last one."""
    return self.message if isinstance(self.message, str) else self.message[-1]["content"]


def _line_texts(record: dict, key: str, where: str) -> tuple[str, ...]:
  """A .jsonl line's optional "stop" or "bad_words": a string or a list of strings (vLLM's
  form), none empty."""
  texts = record.get(key, [])
  texts = [texts] if isinstance(texts, str) else texts
  if not isinstance(texts, list) or not all(isinstance(s, str) for s in texts):
    raise ValueError(f'{where}: "{key}" must be a string or a list of strings')
  if "" in texts:
    raise ValueError(f'{where}: an empty "stop" string would end the answer before its first '
                     "token" if key == "stop" else
                     f'{where}: an empty "{key}" string would ban nothing')
  return tuple(texts)


# A .jsonl line's own sampling settings: asd_jax.sampling.SamplingConfig's fields, which are
# vLLM's and OpenAI's request fields of the same names.
SAMPLING_RECORD_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                        "presence_penalty", "frequency_penalty", "min_tokens", "logit_bias",
                        "allowed_token_ids")
# A .jsonl line's keys (vLLM's and OpenAI's request fields where they have one).
PROMPT_RECORD_KEYS = frozenset({"prompt", "messages", "stop", "max_new_tokens", "seed",
                                "stop_token_ids", "ignore_eos", "n", "include_stop_str_in_output",
                                "bad_words", "guided_json", "guided_regex", "guided_choice",
                                *SAMPLING_RECORD_KEYS})
MAX_SAMPLES = 4096  # a .jsonl line's or --n's samples of one prompt, at most
GUIDE_KINDS = ("json", "regex", "choice")  # structured output: vLLM's guided_json, _regex, _choice


def _line_guide(record: dict, where: str) -> tuple | None:
  """A .jsonl line's optional structured output: one of "guided_json" (a JSON schema, as an
  object or its text), "guided_regex" (a string) or "guided_choice" (a list of strings)."""
  given = [kind for kind in GUIDE_KINDS if f"guided_{kind}" in record]
  if not given:
    return None
  if len(given) > 1:
    raise ValueError(f"{where}: give one of " + ", ".join(f'"guided_{k}"' for k in given))
  kind = given[0]
  value = record[f"guided_{kind}"]
  if kind == "json":
    if isinstance(value, str):
      try:
        value = json.loads(value)
      except ValueError:
        value = None
    if not isinstance(value, dict):
      raise ValueError(f'{where}: "guided_json" must be a JSON schema (an object or its text)')
  elif kind == "regex" and (not isinstance(value, str) or not value):
    raise ValueError(f'{where}: "guided_regex" must be a non-empty string')
  elif kind == "choice" and (not isinstance(value, list) or not value or not all(
      isinstance(c, str) and c for c in value)):
    raise ValueError(f'{where}: "guided_choice" must be a non-empty list of non-empty strings')
  return (kind, tuple(value) if kind == "choice" else value)


def _line_stop_token_ids(record: dict, where: str) -> tuple[int, ...]:
  """A .jsonl line's optional "stop_token_ids": a list of token ids (vLLM's field)."""
  ids = record.get("stop_token_ids", [])
  if not isinstance(ids, list) or not all(
      isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 2**31 for i in ids):
    raise ValueError(f'{where}: "stop_token_ids" must be a list of token ids, got {ids!r}')
  return tuple(ids)


def _line_bool(record: dict, key: str, where: str) -> bool | None:
  value = record.get(key)
  if value is not None and not isinstance(value, bool):
    raise ValueError(f'{where}: "{key}" must be true or false, got {value!r}')
  return value


def _line_sampling(record: dict, where: str) -> dict:
  """A .jsonl line's own sampling fields. Their values are SamplingConfig's to check (the caller
  builds one per line before any model loads); a "logit_bias" object's keys, which JSON makes
  strings, become token ids here."""
  own = {key: record[key] for key in SAMPLING_RECORD_KEYS if key in record}
  bias = own.get("logit_bias")
  if bias is not None:
    if not isinstance(bias, dict) or not all(
        isinstance(k, str) and k.isascii() and k.isdigit() for k in bias):
      raise ValueError(f'{where}: "logit_bias" must be an object from token ids to biases, '
                       'e.g. {"50256": -100}')
    own["logit_bias"] = {int(k): v for k, v in bias.items()}
  return own


def _line_int(record: dict, key: str, low: int, high: int, where: str) -> int | None:
  """A .jsonl line's optional integer field in [low, high]; a bool or float is refused (JSON's
  true and 5.0 are not counts)."""
  value = record.get(key)
  if value is None:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
    raise ValueError(f'{where}: "{key}" must be an integer in [{low}, {high}], got {value!r}')
  return value


def read_prompts_file(path: str) -> list[PromptLine]:
  """The requests of a prompts file, in order: one user message per line, or, for a `.jsonl`
  file, one JSON object per line with a string "prompt" (a message with newlines in it) or
  "messages" (a conversation, checked by models.tokenizer.chat_messages) and optionally "stop"
  (a string or a list: that answer's own stop strings), "stop_token_ids" and "bad_words" (its
  own, added to the flags'), "max_new_tokens", "seed", "ignore_eos", "n",
  "include_stop_str_in_output", one of "guided_json", "guided_regex" and "guided_choice", and
  the sampling settings of SAMPLING_RECORD_KEYS (that answer's own); any other key is refused (a misspelt "stops" would otherwise be dropped without a
  word). Trailing blank lines are dropped; a blank line or message between prompts is refused,
  as a hole in the file is likelier a mistake than a prompt."""
  flag = f"--prompts-file {path}"
  if Path(path).is_dir():
    raise ValueError(f"{flag} is a folder, not a file")
  try:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
  except FileNotFoundError:
    raise ValueError(f"{flag}: no such file") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{flag}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  while lines and not lines[-1].strip():
    lines.pop()
  if not lines:
    raise ValueError(f"empty prompt: {flag} holds no prompts")
  prompts = []
  for number, line in enumerate(lines, 1):
    if str(path).endswith(".jsonl") and line.strip():
      where = f"{flag}: line {number}"
      try:
        record = json.loads(line)
      except ValueError as e:
        raise ValueError(f"{where} is not JSON ({e})") from None
      if not isinstance(record, dict) or (("prompt" in record) == ("messages" in record)):
        raise ValueError(f'{where} must be an object with a string "prompt" or a list of '
                         '"messages"')
      if "prompt" in record and not isinstance(record["prompt"], str):
        raise ValueError(f'{where}: "prompt" must be a string; a conversation goes in '
                         '"messages"')
      unknown = sorted(set(record) - PROMPT_RECORD_KEYS)
      if unknown:
        import difflib
        near = difflib.get_close_matches(unknown[0], PROMPT_RECORD_KEYS, n=1)
        raise ValueError(f"{where} has key(s) {', '.join(map(repr, unknown))}, which a request "
                         f"does not take{f' (did you mean {near[0]!r}?)' if near else ''}; "
                         f"the keys are {', '.join(map(repr, sorted(PROMPT_RECORD_KEYS)))}")
      stop = _line_texts(record, "stop", where)
      own = dict(max_new_tokens=_line_int(record, "max_new_tokens", 1, 2**31 - 1, where),
                 seed=_line_int(record, "seed", 0, 2**32 - 1, where),
                 sampling=_line_sampling(record, where),
                 stop_token_ids=_line_stop_token_ids(record, where),
                 ignore_eos=_line_bool(record, "ignore_eos", where),
                 n=_line_int(record, "n", 1, MAX_SAMPLES, where),
                 include_stop=_line_bool(record, "include_stop_str_in_output", where),
                 bad_words=_line_texts(record, "bad_words", where),
                 guide=_line_guide(record, where))
      if "messages" in record:
        if not isinstance(record["messages"], list) or not record["messages"]:
          raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role", '
                           '"content"} objects')
        from models.tokenizer import chat_messages
        chat_messages(record["messages"], where=where)  # checked now, before any model load
        prompts.append(PromptLine(record["messages"], stop, **own))
        continue
      line = record["prompt"]
    else:
      stop, own = (), {}
    if not line.strip():
      raise ValueError(f"empty prompt: {flag}, line {number} is blank; write one prompt per "
                       "line")
    prompts.append(PromptLine(line, stop, **own))
  return prompts


def bucketed_width(longest: int, bucket: int) -> int:
  """`longest` rounded up to a multiple of `bucket` (at least 1: an empty row still gets a
  column)."""
  from asd_jax.request_checks import round_up
  return max(1, round_up(int(longest), bucket))


def right_pad(rows: list[list[int]], bucket: int = 32) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads token rows to a width rounded up to `bucket` (fewer distinct compiled shapes)."""
  lengths = np.array([len(r) for r in rows], np.int32)
  width = bucketed_width(lengths.max(), bucket)
  out = np.zeros((len(rows), width), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, lengths


def text_stream(tokenizer, row: int = 0, out=None, stop=None, min_tokens: int = 0):
  """A TokenStream that prints row `row`'s text to `out` (stdout) as its tokens arrive.

  The whole answer is re-decoded at each delivery and only the new suffix printed: byte-level
  BPE splits characters across tokens, so a token alone may not decode. A suffix ending in an
  incomplete character (U+FFFD) waits for the next delivery. With `stop` (StopStrings) the
  stop string is never printed, and neither is a tail that may begin one until the next tokens
  settle it; `stream.on_tokens.finish(answer_text)` prints what is still held back. min_tokens:
  the request's; a stop string ending in the text of the tokens before it does not count.
  """
  from asd_jax.token_stream import TokenStream
  return TokenStream(_TextPrinter(tokenizer, row, out, stop, min_tokens))


class _TextPrinter:
  """text_stream's callback (see there)."""

  def __init__(self, tokenizer, row, out, stop, min_tokens):
    self.tokenizer, self.row, self.out, self.stop = tokenizer, row, out, stop
    self.min_tokens = min_tokens
    self.tokens: list[int] = []
    self.shown = 0

  def __call__(self, r: int, new: list[int]) -> None:
    if r != self.row:
      return
    self.tokens.extend(new)
    text = self.tokenizer.decode(self.tokens, skip_special_tokens=True)
    if text.endswith("\ufffd"):
      return
    if self.stop is not None:
      text = self.stop.settled(text, self.stop.min_tokens_chars(self.tokens, self.min_tokens))
    self._show(text)

  def finish(self, answer_text: str) -> None:
    """After the decode call: prints the rest of the final answer (what was held back)."""
    self._show(answer_text)

  def _show(self, text: str) -> None:
    if len(text) > self.shown:
      out = self.out or sys.stdout
      out.write(text[self.shown:])
      out.flush()
      self.shown = len(text)


def time_interleaved(runs: dict[str, Callable], passes: int) -> tuple[dict, dict]:
  """({name: its first call's output}, {name: median seconds of `passes` timed calls}).

  Every run is called once and waited for before any timing (that call compiles; dispatch is
  asynchronous, so a warm-up still running would be timed with the call after it), then the
  runs are timed in turns, so a change in the machine's load hits every one alike."""
  import jax
  outputs = {name: jax.block_until_ready(run()) for name, run in runs.items()}
  seconds = {name: [] for name in runs}
  for _ in range(passes):
    for name, run in runs.items():
      start = time.perf_counter()
      jax.block_until_ready(run())
      seconds[name].append(time.perf_counter() - start)
  return outputs, {name: statistics.median(s) for name, s in seconds.items()}
