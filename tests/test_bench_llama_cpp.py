"""The llama.cpp bench row's pieces that do not need llama.cpp: the float32 GGUF copy (same
metadata, same tensors as our loader reads from the quantised original) and the row's greedy
loop, driven by a stand-in `llama_cpp` module."""

import sys
import types

import gguf
import numpy as np
import pytest

from asd_jax.bench_llama_cpp import (f32_gguf_for, greedy_tokens, llama_cpp_greedy,
                                     write_f32_gguf)
from asd_jax.bench_rows import Batch, BenchContext
from models.gguf_file import load_gguf
from tests.test_loaders import tiny_model, write_gguf

Q = gguf.GGMLQuantizationType


def _quantised_gguf(tmp_path):
  model = tiny_model("llama")
  qtypes = {"model.layers.0.self_attn.q_proj.weight": Q.Q8_0,
            "model.layers.0.self_attn.k_proj.weight": Q.Q4_1,
            "model.layers.1.mlp.up_proj.weight": Q.F16}
  return write_gguf(tmp_path / "q.gguf", model, "llama", qtypes)


def test_f32_copy_keeps_metadata_and_the_dequantised_tensors(tmp_path):
  src = _quantised_gguf(tmp_path)
  dst = tmp_path / "f32.gguf"
  write_f32_gguf(src, dst)
  want_config, want = load_gguf(src)
  got_config, got = load_gguf(dst)
  assert got_config == want_config
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_array_equal(got[name], want[name], err_msg=name)
  reader, original = gguf.GGUFReader(dst), gguf.GGUFReader(src)
  assert {t.tensor_type for t in reader.tensors} == {Q.F32}
  assert Q.Q4_1 in {t.tensor_type for t in original.tensors}  # the copy changed something
  for name, field in original.fields.items():
    if not name.startswith(("GGUF.", "general.file_type")):
      assert reader.get_field(name).contents() == field.contents(), name
  assert reader.get_field("general.file_type").contents() == int(gguf.LlamaFileType.ALL_F32)


def test_hf_folder_targets_are_refused(tmp_path):
  (tmp_path / "config.json").write_text("{}")
  with pytest.raises(ValueError, match="needs a GGUF target"):
    f32_gguf_for(tmp_path)


class _FakeLlama:
  """Emits 5, 6, 7, ... regardless of the prompt, and records how it was called."""
  calls: list = []

  def __init__(self, model_path, **kwargs):
    self.model_path = model_path
    _FakeLlama.calls.append(("init", model_path, kwargs))

  def generate(self, prompt, **kwargs):
    _FakeLlama.calls.append(("generate", list(prompt), kwargs))
    token = 5
    while True:
      yield token
      token += 1


def test_greedy_tokens_stops_at_n_or_eos():
  llm = _FakeLlama("x")
  assert greedy_tokens(llm, [1, 2], 4, ()) == [5, 6, 7, 8]
  assert greedy_tokens(llm, [1, 2], 9, (7,)) == [5, 6, 7]  # EOS kept, like our rows
  kwargs = _FakeLlama.calls[-1][2]
  assert kwargs["top_k"] == 1 and kwargs["repeat_penalty"] == 1.0 and kwargs["reset"]


def test_row_runs_the_f32_copy_on_the_bench_prompts(tmp_path, monkeypatch):
  monkeypatch.setenv("ASD_JAX_CACHE_DIR", str(tmp_path / "cache"))
  src = _quantised_gguf(tmp_path)
  monkeypatch.setitem(sys.modules, "llama_cpp", types.SimpleNamespace(Llama=_FakeLlama))
  _FakeLlama.calls.clear()
  batches = [Batch("mt_bench", ((1, 2, 3), (4,)))]
  ctx = BenchContext(target=str(src), tokenizer=None, batches=batches, max_new_tokens=3,
                     eos_ids=(), batch_size=2, repeats=1)
  row = llama_cpp_greedy(ctx)
  row.warmup(batches)
  out = row.run_batch(batches[0])
  assert out.tokens == [[5, 6, 7], [5, 6, 7]]
  kind, path, kwargs = _FakeLlama.calls[0]
  assert kind == "init" and kwargs["n_ctx"] >= 3 + 3
  assert {t.tensor_type for t in gguf.GGUFReader(path).tensors} == {Q.F32}
  prompts = [c[1] for c in _FakeLlama.calls if c[0] == "generate"]
  assert prompts[-2:] == [[1, 2, 3], [4]]
  from asd_jax import bench_llama_cpp

  def no_second_conversion(*args):
    raise AssertionError("converted twice")

  monkeypatch.setattr(bench_llama_cpp, "write_f32_gguf", no_second_conversion)
  assert str(f32_gguf_for(src)) == path  # converted once, then found in the cache


def test_missing_llama_cpp_is_explained(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
  ctx = BenchContext(target="x", tokenizer=None, batches=[], max_new_tokens=1, eos_ids=(),
                     batch_size=1, repeats=1)
  with pytest.raises(ValueError, match="pip install llama-cpp-python"):
    llama_cpp_greedy(ctx)


def test_bench_says_llama_cpp_is_missing_before_the_model_loads(monkeypatch, capsys,
                                                                no_model_load):
  from asd_jax import bench
  monkeypatch.setitem(sys.modules, "llama_cpp", None)
  with pytest.raises(SystemExit) as e:
    bench.main(["--llama-cpp", "--skip-transformers"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "pip install llama-cpp-python" in err, err
