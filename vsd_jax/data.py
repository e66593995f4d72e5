"""Batches from the array_record dataset: deterministic shuffle by seed, resumable position.

Shape notation (all of vsd_jax): B rows per global batch, T sequence length, K draft steps
(unroll / chain length), D width, Vt target vocab, Vd draft vocab, F fused feature width.

Example order: epoch e visits the split in `permutation(seed, e)` order; batch i of an epoch
takes the next B indices (the last partial batch of an epoch is dropped). The reader's state
is two integers, `DataPosition(epoch, index)`, saved in every checkpoint, so a resumed run
reads exactly the batches an uninterrupted run would have read.

Rows are truncated to T tokens and right-padded with id 0 and loss_mask 0.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from vsd_jax.dataset_builder import DatasetError, open_split


@dataclasses.dataclass(frozen=True)
class DataPosition:
  epoch: int = 0
  index: int = 0  # next example of the epoch's permutation

  def to_json(self) -> dict:
    return dataclasses.asdict(self)

  @classmethod
  def from_json(cls, d) -> "DataPosition":
    return cls(epoch=int(d["epoch"]), index=int(d["index"]))


def to_rows(examples, seq_len: int) -> dict[str, np.ndarray]:
  """A list of dataset examples -> tokens int32 [B, T], loss_mask float32 [B, T],
  length int32 [B] (real tokens per row after truncation)."""
  b = len(examples)
  tokens = np.zeros((b, seq_len), np.int32)
  mask = np.zeros((b, seq_len), np.float32)
  length = np.zeros((b,), np.int32)
  for r, ex in enumerate(examples):
    t = np.asarray(ex["tokens"], np.int32)[:seq_len]
    tokens[r, :len(t)] = t
    mask[r, :len(t)] = np.asarray(ex["loss_mask"])[:seq_len]
    length[r] = len(t)
  return {"tokens": tokens, "loss_mask": mask, "length": length}


class BatchReader:
  """Global batches of one split in a seeded, resumable order.

  With several processes (multi-host), each reads only its contiguous share of every global
  batch: rows [process_index * B / P, (process_index + 1) * B / P).
  """

  def __init__(self, data_dir, split: str, batch_size: int, seq_len: int, seed: int,
               position: DataPosition = DataPosition(), process_index: int = 0,
               process_count: int = 1):
    self.source = open_split(data_dir, split)
    self.num_examples = len(self.source)
    if batch_size > self.num_examples:
      raise DatasetError(f"batch size {batch_size} exceeds the {self.num_examples} examples of "
                         f"split {split!r} in {data_dir}")
    if batch_size % process_count:
      raise ValueError(f"batch size {batch_size} is not divisible by {process_count} processes")
    self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
    self.position = position
    self._share = slice(process_index * batch_size // process_count,
                        (process_index + 1) * batch_size // process_count)
    self._perm_epoch, self._perm = None, None

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_epoch != epoch:
      rng = np.random.default_rng([self.seed, epoch])
      self._perm, self._perm_epoch = rng.permutation(self.num_examples), epoch
    return self._perm

  def next_batch(self) -> dict[str, np.ndarray]:
    """The next batch (this process's rows) and the advanced position."""
    pos = self.position
    if pos.index + self.batch_size > self.num_examples:
      pos = DataPosition(pos.epoch + 1, 0)
    idx = self._permutation(pos.epoch)[pos.index:pos.index + self.batch_size][self._share]
    self.position = DataPosition(pos.epoch, pos.index + self.batch_size)
    rows = to_rows(self.source.__getitems__([int(i) for i in idx]), self.seq_len)
    rows["index"] = idx.astype(np.int64)  # example ids: the offline feature cache's rows
    return rows

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    while True:
      yield self.next_batch()


def fixed_batches(data_dir, split: str, batch_size: int, seq_len: int, limit: int = 0):
  """The first `limit` examples (0: all) of a split in stored order, as whole batches; the
  last batch is padded with empty rows (length 0, loss_mask 0)."""
  source = open_split(data_dir, split)
  n = len(source) if limit <= 0 else min(limit, len(source))
  out = []
  for lo in range(0, n, batch_size):
    rows = to_rows(source.__getitems__(list(range(lo, min(lo + batch_size, n)))), seq_len)
    pad = batch_size - len(rows["length"])
    out.append({k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)])
                for k, v in rows.items()})
  return out


def check_answers_fit(data_dir, seq_len: int, split: str = "train") -> None:
  """Refuses a split none of whose answers starts within the first seq_len tokens: rows are
  truncated to seq_len, so every batch would hold no loss token and the run would train on
  nothing (loss 0) and still end "done". Stops reading at the first row that fits."""
  source = open_split(data_dir, split)
  first_answer = None
  for lo in range(0, len(source), 256):
    for ex in source.__getitems__(list(range(lo, min(lo + 256, len(source))))):
      answer = np.flatnonzero(np.asarray(ex["loss_mask"]) > 0)
      if answer.size and answer[0] < seq_len:
        return
      if answer.size:
        first_answer = int(answer[0]) if first_answer is None else min(first_answer,
                                                                       int(answer[0]))
  where = ("has no answer tokens" if first_answer is None
           else f"first answer token is at position {first_answer}")
  raise DatasetError(f"no row of split {split!r} in {data_dir} has an answer token within "
                     f"seq_len={seq_len} (its earliest {where}): every batch would train on "
                     f"nothing; raise seq_len")


def response_token_counts(data_dir, vocab_size: int, split: str = "train") -> np.ndarray:
  """How often each target id occurs as a response token (for the draft vocabulary)."""
  source = open_split(data_dir, split)
  counts = np.zeros(vocab_size, np.int64)
  for lo in range(0, len(source), 1024):
    for ex in source.__getitems__(list(range(lo, min(lo + 1024, len(source))))):
      t = np.asarray(ex["tokens"])[np.asarray(ex["loss_mask"]) > 0]
      if t.size and (t.max() >= vocab_size or t.min() < 0):
        raise DatasetError(f"{data_dir}: token id {int(t.max())} outside the target's "
                           f"vocabulary ({vocab_size}): a dataset made by another target?")
      counts += np.bincount(t, minlength=vocab_size)
  return counts
