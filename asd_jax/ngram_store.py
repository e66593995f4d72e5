"""The n-gram drafter's fallback: continuations of n-grams in text the target wrote before.

Most rounds of the n-gram drafter find no match in the request's own tokens (77% on the speed
workload's answers), and then it has nothing to propose. Text the target wrote for other
prompts often continues the same way (the retrieval idea of REST, He et al. 2023): phrases,
code idioms, chat boilerplate. The store holds, for every n-gram (n = min_n..max_n) of that
text, one continuation: after the n-gram's most frequent next token, the rest of the most
recent occurrence that continues with it, up to MAX_CONTINUATION tokens and never past the end
of its sequence.

Built offline from token sequences (`build_store`; the shipped store for SmolLM2 holds the
target's greedy answers to the training prompts, disjoint from MT-Bench and HumanEval), kept as
one table per n sorted by an FNV-1a hash of the n-gram, and looked up inside the jitted decode
loop with `jnp.searchsorted` plus an exact check of the n-gram's tokens (when two n-grams share
a hash, the build keeps the more frequent one, so a lookup never returns another n-gram's
continuation).

  python scripts/build_ngram_store.py --dataset out/data/smollm2 --target smollm2-135m \
      --out drafters/smollm2-135m-ngram-store     # the shipped store's command

Shape notation: B rows, C capacity (cache slots), K draft block length, M table entries,
L = MAX_CONTINUATION.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

MAX_CONTINUATION = 8
# The longest n-gram worth storing: the drafter verifies a stored match of n tokens for n - 1
# draft tokens, and a continuation holds MAX_CONTINUATION, so a longer n could only add
# verified repeats of a continuation's last token. Every n also adds a table to the store and a
# lookup to each decode round, and building costs O(tokens * n) per n.
MAX_N = MAX_CONTINUATION + 1
_FNV_OFFSET, _FNV_PRIME = 2166136261, 16777619
STORE_FILE, MANIFEST_FILE = "store.npz", "manifest.json"


class StoreError(ValueError):
  """A store that does not exist, cannot be read, or belongs to another model."""


@dataclasses.dataclass(frozen=True, eq=False)
class NgramStore:
  """Per n (min_n..max_n): sorted hashes [M], n-grams [M, n], continuations [M, L] (padded
  past their end with their last token, so the loop needs no lengths).

  Compared and hashed by identity (its tables are arrays): the n-gram drafter is built once
  per store object.

  `tables` is a pytree of numpy arrays; it is the n-gram drafter's params, so the decode loop
  gets it as an argument instead of baking megabytes of constants into the program.
  """

  min_n: int
  max_n: int
  vocab_size: int
  tables: dict
  source_tokens: int

  @property
  def entries(self) -> int:
    return sum(len(t["hashes"]) for t in self.tables.values())


def fnv_hash(grams: np.ndarray) -> np.ndarray:
  """uint32 FNV-1a over the last axis (numpy; `_fnv_hash_jax` computes the same in the loop)."""
  h = np.full(grams.shape[:-1], _FNV_OFFSET, np.uint32)
  for i in range(grams.shape[-1]):
    h = (h ^ grams[..., i].astype(np.uint32)) * np.uint32(_FNV_PRIME)
  return h


def _fnv_hash_jax(grams: jax.Array) -> jax.Array:
  h = jnp.full(grams.shape[:-1], _FNV_OFFSET, jnp.uint32)
  for i in range(grams.shape[-1]):
    h = (h ^ grams[..., i].astype(jnp.uint32)) * jnp.uint32(_FNV_PRIME)
  return h


def check_sizes(min_n: int, max_n: int) -> None:
  """The n-gram sizes a store holds: 1 <= min_n <= max_n <= MAX_N (else ValueError)."""
  if not 1 <= min_n <= max_n:
    raise ValueError(f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
  if max_n > MAX_N:
    raise ValueError(f"max_n {max_n} is above {MAX_N}: the drafter verifies a stored match of "
                     f"n tokens for n - 1 draft tokens, and a stored continuation holds "
                     f"{MAX_CONTINUATION}")


def build_store(sequences: Sequence[Sequence[int]], vocab_size: int, min_n: int = 2,
                max_n: int = 4) -> NgramStore:
  """The store of `sequences` (token ids < vocab_size); see the module docstring."""
  check_sizes(min_n, max_n)
  seqs = [np.asarray(s, np.int64) for s in sequences if len(s)]
  if not seqs:
    raise ValueError("build_store needs at least one non-empty token sequence")
  for s in seqs:
    if s.min() < 0 or s.max() >= vocab_size:
      raise ValueError(f"token ids must be in [0, {vocab_size}), got {s.min()}..{s.max()}")
  # One stream with a -1 after every sequence: n-grams and continuations stop at it.
  stream = np.concatenate([np.append(s, -1) for s in seqs])
  padded = np.concatenate([stream, np.full(MAX_CONTINUATION, -1)])
  tables = {}
  for n in range(min_n, max_n + 1):
    ends = np.arange(n - 1, len(stream) - 1)  # n-gram stream[e-n+1 .. e], next token e+1
    grams = np.stack([stream[ends - n + 1 + i] for i in range(n)], axis=1)
    ok = (grams >= 0).all(axis=1) & (stream[ends + 1] >= 0)
    ends, grams = ends[ok], grams[ok]
    if not len(ends):
      continue
    hashes = fnv_hash(grams)
    nxt = stream[ends + 1]
    # Group by (hash, n-gram, next token); latest occurrence last within a group.
    order = np.lexsort((ends, nxt, *[grams[:, i] for i in reversed(range(n))], hashes))
    hashes, grams, nxt, ends = hashes[order], grams[order], nxt[order], ends[order]
    key = np.concatenate([hashes[:, None].astype(np.int64), grams, nxt[:, None]], axis=1)
    new_group = np.ones(len(key), bool)
    new_group[1:] = (key[1:] != key[:-1]).any(axis=1)
    group_start = np.flatnonzero(new_group)
    group_end = np.append(group_start[1:], len(key)) - 1  # the latest occurrence
    counts = group_end - group_start + 1
    g_hash, g_gram, g_end = hashes[group_end], grams[group_end], ends[group_end]
    # Per hash keep the group with the most occurrences (a hash shared by two n-grams keeps
    # the more frequent n-gram; one n-gram keeps its most frequent next token), ties -> latest.
    pick = np.lexsort((g_end, counts, g_hash))
    last_of_hash = np.ones(len(pick), bool)
    last_of_hash[:-1] = g_hash[pick][1:] != g_hash[pick][:-1]
    pick = pick[last_of_hash]
    cont = padded[g_end[pick][:, None] + 1 + np.arange(MAX_CONTINUATION)[None]]
    stop = np.cumsum(cont < 0, axis=1) > 0
    last = cont[np.arange(len(cont)), (~stop).sum(axis=1) - 1]  # >= 1 token: the next one
    tables[n] = {"hashes": g_hash[pick], "grams": g_gram[pick].astype(np.int32),
                 "continuations": np.where(stop, last[:, None], cont).astype(np.int32)}
  return NgramStore(min_n, max_n, int(vocab_size), tables, int(sum(map(len, seqs))))


# How each round's lookup binary-searches a table (jnp.searchsorted's `method`). "scan" is a
# while loop of log2(M) steps (17 for the shipped store), the fastest on a CPU. On a GPU each
# step of an XLA while loop is its own kernel launches plus a read of the loop condition, for
# each table (3) every round, so accelerators take the unrolled search, as JAX's documentation
# advises for GPUs: the same indices, no loop.
SEARCH_METHODS = {"cpu": "scan", "default": "scan_unrolled"}


def _search(hashes_M: jax.Array, h_B: jax.Array) -> jax.Array:
  return jax.lax.platform_dependent(
      hashes_M, h_B,
      **{platform: functools.partial(jnp.searchsorted, method=method)
         for platform, method in SEARCH_METHODS.items()})


def store_draft(tables: dict, history_BxC: jax.Array, length_B: jax.Array,
                num_draft: int) -> tuple[jax.Array, jax.Array]:
  """(int32[B, K] draft, int32[B] n): the continuation of each row's longest stored suffix and
  that suffix's length n (0: nothing stored matched).

  Tries the longest n first; a row shorter than n, or whose suffix is not stored, tries the next
  n. Past a continuation's end (and for K > L) the draft repeats its last token: any guess is
  safe, the target verifies it.
  """
  b = history_BxC.shape[0]
  rows_Bx1 = jnp.arange(b)[:, None]
  draft_BxK = jnp.zeros((b, num_draft), jnp.int32)
  matched_B = jnp.zeros((b,), jnp.int32)
  for n in sorted(tables, reverse=True):
    t = tables[n]
    pos_BxN = jnp.maximum(length_B[:, None] - n + jnp.arange(n)[None], 0)
    suffix_BxN = history_BxC[rows_Bx1, pos_BxN]
    h_B = _fnv_hash_jax(suffix_BxN)
    hashes_M = jnp.asarray(t["hashes"])
    idx_B = jnp.clip(_search(hashes_M, h_B), 0, hashes_M.shape[0] - 1)
    hit_B = ((hashes_M[idx_B] == h_B) & (jnp.asarray(t["grams"])[idx_B] == suffix_BxN).all(-1)
             & (length_B >= n))
    cont_BxL = jnp.asarray(t["continuations"])[idx_B]
    take_K = jnp.minimum(jnp.arange(num_draft), cont_BxL.shape[1] - 1)
    new = hit_B & (matched_B == 0)
    draft_BxK = jnp.where(new[:, None], cont_BxL[:, take_K], draft_BxK)
    matched_B = jnp.where(new, n, matched_B)
  return draft_BxK, matched_B


def check_store_folder(folder: str | Path) -> None:
  """Raises StoreError unless writing a store into `folder` overwrites nothing but an earlier
  store: fine are a missing or empty folder, or one holding only store.npz and a manifest.json
  with a store's keys. Anything else (an exported drafter's manifest beside its weights, say)
  is someone's data."""
  folder = Path(folder)
  if not folder.exists() and not folder.is_symlink():
    return
  if not folder.is_dir():
    raise StoreError(f"{folder} exists and is not a folder; pick a new path for the store")
  names = sorted(p.name for p in folder.iterdir())
  others = [n for n in names if n not in (STORE_FILE, MANIFEST_FILE) or not (folder / n).is_file()]
  if others:
    raise StoreError(f"{folder} holds {', '.join(others[:3])}{' ...' if len(others) > 3 else ''}, "
                     "so it is not an n-gram store folder; refusing to write a store into it "
                     "(pick a new or empty path)")
  if MANIFEST_FILE in names:
    try:
      manifest = json.loads((folder / MANIFEST_FILE).read_text())
    except (OSError, ValueError) as e:
      raise StoreError(f"{folder}/{MANIFEST_FILE} is unreadable ({e}); refusing to replace it "
                       "(pick a new or empty path)") from None
    keys = {"min_n", "max_n", "max_continuation"}
    if not (isinstance(manifest, dict) and keys <= manifest.keys()):
      raise StoreError(f"{folder}/{MANIFEST_FILE} is not an n-gram store's (no min_n / max_n / "
                       "max_continuation); refusing to replace it (pick a new or empty path)")


def save_store(sequences: Sequence[Sequence[int]], vocab_size: int, folder: str | Path,
               manifest: dict, min_n: int = 2, max_n: int = 4) -> NgramStore:
  """Writes the store's source text (a few hundred KB; the tables are rebuilt on load, in well
  under a second) and its manifest; returns the store. StoreError (before writing) when
  `folder` holds anything but an earlier store (check_store_folder)."""
  store = build_store(sequences, vocab_size, min_n, max_n)  # also validates the text
  check_store_folder(folder)
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  seqs = [np.asarray(q, np.int64) for q in sequences if len(q)]
  dtype = np.uint16 if vocab_size <= 1 << 16 else np.int32
  np.savez_compressed(folder / STORE_FILE, tokens=np.concatenate(seqs).astype(dtype),
                      lengths=np.asarray([len(q) for q in seqs], np.int64))
  manifest = dict(manifest, min_n=min_n, max_n=max_n, vocab_size=int(vocab_size),
                  sequences=len(seqs), source_tokens=store.source_tokens,
                  entries=store.entries, max_continuation=MAX_CONTINUATION)
  (folder / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
  return store


def load_store(folder: str | Path, vocab_size: int) -> NgramStore:
  """A saved store; StoreError when missing, unreadable, or made for another vocabulary."""
  folder = Path(folder)
  try:
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    with np.load(folder / STORE_FILE) as data:
      tokens, lengths = data["tokens"].astype(np.int64), data["lengths"]
  except (OSError, ValueError, KeyError) as e:
    raise StoreError(f"n-gram store {folder}: cannot read it ({e}); build one with "
                     "scripts/build_ngram_store.py") from None
  if manifest.get("vocab_size") != vocab_size:
    raise StoreError(f"n-gram store {folder} was built for a vocabulary of "
                     f"{manifest.get('vocab_size')} tokens (target {manifest.get('target')!r}); "
                     f"this target has {vocab_size}")
  if lengths.sum() != len(tokens):
    raise StoreError(f"n-gram store {folder}: its sequence lengths do not add up to its tokens")
  sequences = np.split(tokens, np.cumsum(lengths)[:-1])
  if "min_n" not in manifest or "max_n" not in manifest:
    raise StoreError(f"n-gram store {folder}: its manifest has no min_n / max_n")
  try:  # a manifest edited by hand: say which store, not only what is wrong
    return build_store(sequences, vocab_size, manifest["min_n"], manifest["max_n"])
  except (TypeError, ValueError) as e:
    raise StoreError(f"n-gram store {folder}: {e}") from None
