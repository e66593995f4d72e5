"""A TensorFlow-Datasets builder for target-regenerated training text, in `array_record` files.

Each example is one prompt plus the target's greedy answer to it:

    tokens     int32 [n]   prompt ids (chat template applied) followed by the response ids
    loss_mask  uint8 [n]   1 on response tokens (what a drafter learns to predict), 0 on the prompt
    prompt_len int32       index of the first response token

Splits: "train" and "heldout" (disjoint prompts; neither overlaps the eval suites).

No TensorFlow is needed: tfds (>= 4.9) serialises examples with its own protobuf code when
`file_format="array_record"` and reads them back with `tfds.data_source` (random access, as
grain and our reader use). Verified with tensorflow-datasets 4.9.10 / array_record 0.8.6 in an
environment without TensorFlow installed.

The builder takes its examples from the caller (`write_dataset`), so generation (slow, on the
target) and storage stay separate; `dataset_metadata` records which target made the data.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

BUILDER_NAME = "target_responses"
SPLITS = ("train", "heldout")


class DatasetError(ValueError):
  """A missing, empty or incompatible training dataset."""


def _tfds():
  import tensorflow_datasets as tfds  # heavy import: only when data is touched
  return tfds


def _builder_class():
  tfds = _tfds()
  cls = getattr(_builder_class, "cls", None)
  if cls is not None:
    return cls

  class LocalDatasetInfo(tfds.core.DatasetInfo):
    # A builder whose folder holds no dataset_info.json yet (every fresh build) asks
    # `initialize_from_bucket` for published metadata; tfds's version makes an empty temporary
    # folder first and never removes it (one leaked /tmp/tmp*tfds per build). This dataset is
    # local only, so there is nothing to fetch.
    def initialize_from_bucket(self) -> None:
      return None

  class TargetResponses(tfds.core.GeneratorBasedBuilder):
    """Prompts answered by a frozen target with greedy decoding (token ids + loss masks)."""

    name = BUILDER_NAME
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "tokens, loss_mask, prompt_len"}

    # tfds 4.9.10 locates a builder's source folder (for download checksums) through
    # `importlib_resources`, which Python >= 3.11 installs no longer pull in; this builder
    # downloads nothing, so it has no checksums file to find.
    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
      return None

    def __init__(self, *, examples: Mapping[str, Sequence] | None = None,
                 metadata: Mapping[str, Any] | None = None, **kwargs):
      self._examples = examples
      self._extra_metadata = dict(metadata or {})
      super().__init__(**kwargs)

    def _info(self):
      return LocalDatasetInfo(
          builder=self,
          description=__doc__,
          features=tfds.features.FeaturesDict({
              "tokens": tfds.features.Tensor(shape=(None,), dtype=np.int32),
              "loss_mask": tfds.features.Tensor(shape=(None,), dtype=np.uint8),
              "prompt_len": tfds.features.Scalar(dtype=np.int32),
          }),
          metadata=tfds.core.MetadataDict(self._extra_metadata),
      )

    def _split_generators(self, dl_manager):
      del dl_manager
      if self._examples is None:
        raise DatasetError("this dataset is not prepared and has no examples to write; build "
                           "it with `python -m vsd_jax.build_dataset`")
      return {split: self._generate_examples(self._examples.get(split, ()))
              for split in SPLITS}

    def _generate_examples(self, rows):
      for i, (prompt, response) in enumerate(rows):
        prompt = np.asarray(prompt, np.int32)
        response = np.asarray(response, np.int32)
        mask = np.concatenate([np.zeros(len(prompt), np.uint8), np.ones(len(response), np.uint8)])
        yield i, {"tokens": np.concatenate([prompt, response]), "loss_mask": mask,
                  "prompt_len": np.int32(len(prompt))}

  _builder_class.cls = TargetResponses
  return TargetResponses


def write_dataset(data_dir: str | os.PathLike,
                  splits: Mapping[str, Iterable[tuple[Sequence[int], Sequence[int]]]],
                  metadata: Mapping[str, Any], overwrite: bool = False) -> Path:
  """Writes (prompt ids, response ids) pairs per split as array_record files under data_dir.

  tfds writes into an `incomplete.*` folder and renames it when done, so a reader never sees
  half a dataset. Returns the dataset's version folder.
  """
  tfds = _tfds()
  for split in SPLITS:
    if not splits.get(split):
      raise DatasetError(f"split {split!r} has no examples")
  cls = _builder_class()
  version_dir = Path(data_dir) / BUILDER_NAME / str(cls.VERSION)
  if version_dir.exists() and not overwrite:
    raise DatasetError(f"{version_dir} exists; pass overwrite=True (--overwrite) to rebuild")
  if overwrite:
    _remove_old_build(Path(data_dir), version_dir)
  builder = cls(examples={k: list(v) for k, v in splits.items()}, metadata=metadata,
                data_dir=os.fspath(data_dir), file_format="array_record")
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      verify_ssl=False, download_mode=tfds.download.GenerateMode.REUSE_DATASET_IF_EXISTS))
  return version_dir


def _remove_old_build(data_dir: Path, version_dir: Path) -> None:
  """Everything derived from the dataset being replaced: offline feature caches index its rows
  (vsd_jax.feature_cache), and an interrupted build leaves an `incomplete.*` folder behind."""
  if version_dir.exists():
    shutil.rmtree(version_dir)
  for old in version_dir.parent.glob("incomplete.*"):
    shutil.rmtree(old, ignore_errors=True)
  for old in data_dir.glob("features_*.npy"):
    old.unlink()


def open_split(data_dir: str | os.PathLike, split: str):
  """The random-access `tfds.data_source` of one split (len(), [i], __getitems__)."""
  tfds = _tfds()
  _builder_class()  # registers the builder name with tfds
  if split not in SPLITS:
    raise DatasetError(f"unknown split {split!r}; splits: {SPLITS}")
  _check_prepared(data_dir)
  source = tfds.data_source(BUILDER_NAME, split=split, data_dir=os.fspath(data_dir))
  if len(source) == 0:
    raise DatasetError(f"dataset {data_dir}: split {split!r} is empty")
  return source


def dataset_metadata(data_dir: str | os.PathLike) -> dict[str, Any]:
  """The metadata dict written with the dataset (target, counts, generation speed)."""
  tfds = _tfds()
  _builder_class()
  _check_prepared(data_dir)
  try:
    builder = tfds.builder(BUILDER_NAME, data_dir=os.fspath(data_dir))
  except Exception as e:  # tfds raises several types for a missing/corrupt folder
    raise DatasetError(f"no readable training dataset in {data_dir}: {e}") from None
  return dict(builder.info.metadata or {})


def _check_prepared(data_dir) -> None:
  root = Path(data_dir) / BUILDER_NAME
  version_dir = root / str(_builder_class().VERSION)
  if (version_dir / "dataset_info.json").is_file():
    return
  # tfds writes into `incomplete.<random>_<version>/` and renames it only when done: such a
  # folder alone is a build that was killed, not a dataset.
  partial = sorted(p.name for p in root.glob("incomplete.*")) if root.is_dir() else []
  if partial:
    raise DatasetError(f"the dataset build in {data_dir} was interrupted (only {root}/"
                       f"{partial[0]} is there, no {version_dir.name}/); rebuild it with "
                       "`python -m vsd_jax.build_dataset --config=<preset> --overwrite`")
  raise DatasetError(f"no training dataset in {data_dir} (expected {version_dir}/); build it "
                     "with `python -m vsd_jax.build_dataset --config=<preset>`")


# Metadata entry -> the DataConfig field that sets it (the settings that shape the examples).
_DATA_FIELDS = {"num_train": "num_prompts", "num_heldout": "heldout_prompts",
                "max_new_tokens": "max_new_tokens", "prompt_seed": "prompt_seed"}


def check_dataset_fits(data_dir, meta: Mapping[str, Any], cfg, target_source: str) -> None:
  """Refuses a dataset that `cfg` (a TrainConfig) with target `target_source` would not have
  built. A field the metadata lacks (datasets from before it was recorded) is not compared."""
  rebuild = (f"rebuild it (python -m vsd_jax.build_dataset --config={cfg.name} with the same "
             "--set flags and --overwrite) or point data_dir elsewhere")
  if meta.get("target") != target_source:
    raise DatasetError(f"dataset {data_dir} was generated by target {meta.get('target')!r}, "
                       f"this preset's target is {target_source!r}; {rebuild}")
  built = meta.get("answers", "greedy")  # datasets from before the field were all greedy
  if built != cfg.data.answers:
    raise DatasetError(f"dataset {data_dir} holds answers made as {built!r}, this preset asks "
                       f"for {cfg.data.answers!r}; {rebuild}")
  for key, field in _DATA_FIELDS.items():
    want = getattr(cfg.data, field)
    if key in meta and meta[key] != want:
      raise DatasetError(f"dataset {data_dir} was built with data.{field}={meta[key]}, this "
                         f"preset has data.{field}={want}; {rebuild}")
