# Two commands matter: `make demo` and `make test`. Both run `make setup` first (idempotent).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
PIP := $(BIN)/pip -q --disable-pip-version-check
SHARED ?= ../shared
BUF_VERSION ?= 1.75.0

.PHONY: setup demo test protos lint bench clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -c constraints.txt torch==2.13.0
	$(PIP) install -c constraints.txt -e ".[train,k8s,vllm,dev]" "torchvision==0.28.0"
	$(PIP) uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
	$(BIN)/python -c "import torch, sys; assert torch.version.cuda is None, 'a CUDA torch was installed'; print('torch', torch.__version__)"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(BIN)/mascot run --situations $(SHARED)/data/empathetic_dialogues/test_situations.jsonl --limit 20 --out runs/demo

test: setup
	$(BIN)/python -m pytest -m "not gpu and not e2e" --durations=15 $(PYTEST_ARGS)

protos: setup
	$(BIN)/python -m mascot.core.protogen

lint: setup
	npx --yes @bufbuild/buf@$(BUF_VERSION) lint

bench: setup
	$(BIN)/python bench/turn_overhead.py
	$(BIN)/python bench/grpo_step.py --size full
	$(BIN)/python bench/vllm_serving.py --size full

clean:
	rm -rf runs .pytest_cache
