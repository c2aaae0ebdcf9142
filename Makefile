# timbench: `make quick` sets up and runs the main job; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: setup quick test bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

quick: setup
	$(VENV)/bin/timbench align --table bench/align_quick.yaml --out results/align
	cat results/align/align_quick.md

test: setup
	$(PY) -m pytest -q -m "not slow"

bench: setup
	$(PY) -m pytest bench/ -q --benchmark-json results/bench/bench.json
	$(PY) bench/summarize.py

clean:
	rm -rf $(VENV) *.egg-info
