"""scripts/load_test.py, small: the README's serving promise (no compilation after warm-up,
steady memory, every output equal to the request alone) is run by `make test` too, on 24
requests over every (rule, prompt-width) bucket, in its own process so that other tests'
programs and listeners do not enter its counts."""

import json
import os
import subprocess
import sys

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
