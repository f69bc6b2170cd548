# One set-up for everything: `make run` serves the embedded default model, `make test` runs every suite.
# Heavy artefacts live in a per-user cache so that a fresh clone on the same machine reuses them: the
# third-party Python packages (DEPS_VENV, one per lock), Rust build outputs (CARGO_TARGET_DIR) and converted models.
# Each clone gets its own small `.venv` layered on DEPS_VENV (a .pth line), holding this clone's packages
# (editable) and binaries, so two clones never point each other's entry points at the wrong tree.

SHELL := /bin/bash
CACHE_DIR ?= $(HOME)/.cache/decision-inference
# Keyed by the lock, so clones on one machine with different locks never re-sync each other's environment
# (uv hard-links packages from its cache: a second environment costs little disk). The two newest are kept.
LOCK_HASH := $(shell cat uv.lock 2>/dev/null | sha256sum | cut -c1-16)
DEPS_VENV := $(CACHE_DIR)/venv-$(LOCK_HASH)
VENV := .venv
PY := $(VENV)/bin/python
PORT ?= 3000
export CARGO_TARGET_DIR ?= $(CACHE_DIR)/target
export DECISION_CACHE_DIR := $(CACHE_DIR)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

# uv installs the one lock (uv.lock, the workspace in pyproject.toml); uv itself is pinned and lives in its own venv.
UV_VERSION := 0.13.9
UV := $(CACHE_DIR)/uv-$(UV_VERSION)/bin/uv
STAMP := $(DEPS_VENV)/.installed
LOCAL_PACKAGES := -e ./server -e ./bench

.PHONY: image lock-check install allocator compiler browser venv stubs rust fixtures run test test-rust test-python test-integration lint clean

install: venv stubs rust allocator compiler
	@echo "install: ready ($(VENV)/bin/decision-launcher)"

# The shards' faster allocator (the launcher's --allocator auto preloads it): 10-22 % faster forwards measured, since
# freed activations are reused instead of page-faulted in again. Debian's package, installed when this runs as root
# with apt; elsewhere a hint, and the shards run on glibc malloc.
allocator:
	@if [ -n "$$(ls /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib64/libtcmalloc_minimal.so.4 2>/dev/null)" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; } \
			|| echo "install: could not install libtcmalloc-minimal4; the shards will use glibc malloc (slower)"; \
	else echo "install: libtcmalloc-minimal4 is missing (apt install libtcmalloc-minimal4); the shards will use glibc malloc (slower)"; fi

# g++ and the Python headers of the environment's Python: torch.compile builds the bfloat16 elementwise kernels with
# them (`--compile auto`, server/decision_server/fused.py; its tests need them). Debian's g++ is installed when this
# runs as root with apt; a Python without headers is named, and the shards then run those chains eagerly.
compiler: $(STAMP)
	@command -v g++ >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; }; } \
		|| echo "install: g++ is missing (apt install g++); bfloat16 shards will run their elementwise chains eagerly"
	@$(DEPS_VENV)/bin/python -c 'import os, sys, sysconfig; h = os.path.join(sysconfig.get_paths()["include"], "Python.h"); os.path.exists(h) or sys.exit(f"install: {h} is missing (python3-dev for a Debian Python); bfloat16 shards will run their elementwise chains eagerly")' || true

# Debian's chromium and its driver, which integration-tests/test_playground.py drives through the playground page
# (selenium, headless). Installed when this runs as root with apt (about 105 s on a fresh 2-core machine, apt-get
# update included); elsewhere a hint, and that test fails rather than skipping.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1; } \
			|| { echo "install: could not install chromium chromium-driver; test_playground.py will fail"; exit 1; }; \
	else echo "install: chromium and chromedriver are missing (apt install chromium chromium-driver); test_playground.py will fail"; fi

venv: $(STAMP)
	@# Project packages belong to each clone's own .venv, never to the shared environment.
	@if [ -L $(VENV) ] || [ ! -x $(VENV)/bin/python ]; then rm -rf $(VENV) && python3 -m venv --without-pip $(VENV); fi
	@echo "import site; site.addsitedir('$$($(DEPS_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')')" \
		> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/_decision_deps.pth"
	@$(UV) pip install -q --python $(PY) --no-deps --no-build-isolation $(LOCAL_PACKAGES)
	@for tool in jevcompat ruff mypy; do ln -sfn $(DEPS_VENV)/bin/$$tool $(VENV)/bin/$$tool; done

$(UV):
	python3 -m venv $(CACHE_DIR)/uv-$(UV_VERSION)
	$(CACHE_DIR)/uv-$(UV_VERSION)/bin/python -m pip install -q uv==$(UV_VERSION)

# Exactly the lock's third-party packages (sync removes anything else); the workspace's own packages are not in it.
$(STAMP): uv.lock | $(UV)
	@test -x $(DEPS_VENV)/bin/python || python3 -m venv --without-pip $(DEPS_VENV)
	$(UV) export -q --frozen --all-packages --no-emit-workspace --format requirements-txt -o $(DEPS_VENV)/locked.txt
	$(UV) pip sync -q --python $(DEPS_VENV)/bin/python $(DEPS_VENV)/locked.txt
	@touch $@
	@# Older lock environments beyond the newest two go (another clone may still use the previous one).
	@ls -dt $(CACHE_DIR)/venv-* 2>/dev/null | tail -n +3 | xargs -r rm -rf

# The lock must match every pyproject.toml (CI runs this before the tests).
lock-check: $(UV)
	$(UV) lock --check

stubs: venv
	@$(PY) -m grpc_tools.protoc --proto_path=decision_server/pb=proto \
		--python_out=server --grpc_python_out=server --pyi_out=server decision_server/pb/decision.proto

# The launcher finds the router, the shard and libdecision_mkl_dispatch.so (preloaded into shards on AMD CPUs: see
# mkl-dispatch/src/lib.rs) next to itself.
rust:
	cargo build --release --locked -p decision-router -p decision-launcher -p decision-mkl-dispatch
	@install -m 755 $(CARGO_TARGET_DIR)/release/decision-router $(CARGO_TARGET_DIR)/release/decision-launcher \
		$(CARGO_TARGET_DIR)/release/libdecision_mkl_dispatch.so $(VENV)/bin/

run: install
	$(VENV)/bin/decision-launcher --port $(PORT)

# The embedded default model and tiny random-weight models of every served architecture (tiny Qwen3 and
# Qwen3.5 with their real tokenizers; LFM2-VL, Gemma4 and DiffusionGemma with small synthetic ones), each built once.
HYBRID_FIXTURES := tiny-qwen3.5 tiny-qwen3.5-moe tiny-lfm2-vl tiny-gemma4 tiny-gemma4-mm
# Fixtures that ship their processor (image reads); a cached copy from before they did is rebuilt.
PROCESSOR_FIXTURES := tiny-qwen3.5 tiny-qwen3.5-moe tiny-lfm2-vl tiny-gemma4-mm tiny-diffusiongemma
# Block diffusion (DiffusionGemma canvas reads): MoE text layers, a Gemma-style synthetic tokenizer and template.
DIFFUSION_FIXTURES := tiny-diffusiongemma
# Joint-schema (Clef-Flash, Clef-Omni): tiny Qwen3.5 / Qwen3-Omni thinker backbones with a random head of a small config.
CLEF_FIXTURES := tiny-clef-flash tiny-clef-omni
# Their builder's revision (decision_server/fixtures/clef.py, CLEF_FIXTURE_REVISION), recorded in each folder's completion marker; a cached
# copy of another revision is rebuilt.
CLEF_FIXTURE_REVISION := 2
fixtures: venv
	@$(VENV)/bin/decision-server export-default --out $(CACHE_DIR)/models/SmolLM2-135M-Instruct
	@# Folders are published atomically, so one with a config.json is complete (skips a 10 s torch import each).
	@for name in tiny-qwen3 $(HYBRID_FIXTURES) $(DIFFUSION_FIXTURES) $(CLEF_FIXTURES); do test -f $(CACHE_DIR)/models/$$name/config.json && \
		{ [[ " $(PROCESSOR_FIXTURES) " != *" $$name "* ]] || test -f $(CACHE_DIR)/models/$$name/processor_config.json; } && \
		{ [[ " $(CLEF_FIXTURES) " != *" $$name "* ]] || \
		  grep -q '"revision": $(CLEF_FIXTURE_REVISION)' $(CACHE_DIR)/models/$$name/.decision-complete.json 2>/dev/null; } || \
		$(VENV)/bin/decision-server make-fixture $$name --out $(CACHE_DIR)/models/$$name || exit 1; done

# The image builds in the background while the unit suites run (a cold build is 13 min of downloads, package installs
# and layer writes on 2 cores; the unit suites about 10), and the integration suite, which runs it, waits for it. The
# Python suites go first: the image's script starts with a cargo build (a no-op after `install`) that would otherwise
# queue behind the Rust tests' build on cargo's lock. Its log is printed once it is done; a failure stops the run.
test: lock-check install fixtures browser
	@log=$$(mktemp); scripts/image.sh > $$log 2>&1 & image=$$!; \
	status=0; $(MAKE) --no-print-directory test-python test-rust || status=$$?; \
	if [ $$status != 0 ]; then pkill -P $$image; kill $$image 2>/dev/null; wait $$image; rm -f $$log; exit $$status; fi; \
	echo "test: waiting for the image"; wait $$image || status=$$?; sed 's/^/  /' $$log; rm -f $$log; \
	[ $$status = 0 ] || { echo "test: the image did not build"; exit $$status; }; \
	$(MAKE) --no-print-directory test-integration

test-rust:
	cargo test --release --locked --workspace

test-python:
	$(PY) -m pytest -q --durations=10 server/tests
	$(PY) -m pytest -q bench/tests

# Both targets (local launcher and the image); containers and networks the suite started are removed by label even
# after a failure.
# The slowest tests are listed (CI's time is budgeted: bench/results/2026-12-03-zen3-ci/).
test-integration:
	@status=0; $(PY) -m pytest -q --durations=15 integration-tests || status=$$?; \
		ids=$$(docker ps -aq --filter label=decision-inference.test 2>/dev/null); \
		if [ -n "$$ids" ]; then docker rm -f $$ids >/dev/null; echo "removed leftover test containers: $$ids"; fi; \
		nets=$$(docker network ls -q --filter label=decision-inference.test 2>/dev/null); \
		if [ -n "$$nets" ]; then docker network rm $$nets >/dev/null; echo "removed leftover test networks: $$nets"; fi; \
		exit $$status

# decision-inference:latest from the root Dockerfile, on an offline base image made from this host's apt sources.
image:
	scripts/image.sh

lint: venv
	cargo fmt --all --check
	cargo clippy --release --locked --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check server bench
	$(VENV)/bin/ruff format --check server/decision_server

clean:
	rm -rf $(VENV)
