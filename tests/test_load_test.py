"""scripts/load_test.py, small: the README's serving promise (no compilation after warm-up,
steady memory, every output equal to the request alone) is run by `make test` too, on 24
requests over every (rule, prompt-width) bucket, the sampled ones each with their own
settings (one SamplingConfig per row), in its own process so that other tests' programs and
listeners do not enter its counts."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_load_test_keeps_its_promises_on_24_requests(tmp_path):
  out = tmp_path / "load_test.json"
  run = subprocess.run([sys.executable, "scripts/load_test.py", "--requests", "24", "--json",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stdout + run.stderr
  report = json.loads(out.read_text())
  assert report["ok"] and report["requests"] == 24 and report["outputs_equal_alone"] == 24
  assert report["compilations_after_warmup"] == 0
  assert report["asd_decode_programs_at_end"] == report["asd_decode_programs_after_warmup"]
  assert len(report["rules"]) == 3 and report["buckets"] >= 6  # every rule, several widths
  assert report["tokens_generated"] > 0


@pytest.mark.parametrize("argv,message", [
    (["--requests", "0"], "--requests and --batch must be positive, got 0 and 8"),
    (["--batch", "-1"], "--requests and --batch must be positive, got 512 and -1"),
    (["--json", "{tmp}/a_file/out.json"], "a_file is a file, not a folder"),
])
def test_bad_flags_fail_before_the_run(argv, message, tmp_path, capsys):
  """0 requests used to check nothing and report OK; an unwritable --json failed at the end."""
  from scripts import load_test
  (tmp_path / "a_file").write_text("")
  with pytest.raises(SystemExit) as e:
    load_test.main([a.format(tmp=tmp_path) for a in argv])
  assert e.value.code == 2 and message in capsys.readouterr().err
