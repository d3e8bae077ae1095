# The project's commands. `make test` is the test command (README.md); CI runs
# `make lint test` from .ci/run.

SPDK_DIR ?= /opt/spdk
PYTHON ?= python3
VENV ?= .venv

.PHONY: test test-rust test-loom test-rpc test-spdk lint lab bench

test: test-rust test-loom test-rpc test-spdk

test-rust:
	cargo test

# The ledger's lock-free parts, model-checked by loom (own target dir: other cfg).
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p qos-core --release --lib loom

# The rpc.py plugin's tests, in a virtualenv with pytest (and the PyPI spdk package,
# whose rpc.py the real-parser tests drive).
test-rpc: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q rpc-scripts/tests

$(VENV)/.installed: rpc-scripts/requirements-test.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r rpc-scripts/requirements-test.txt
	touch $@

# Tests against a real nvmf_tgt: run only where an SPDK shared-library build is found.
test-spdk:
	@if [ -f "$(SPDK_DIR)/build/lib/libspdk_nvmf.so" ]; then \
		SPDK_DIR="$(SPDK_DIR)" bash spdk-plugin/tests/run.sh; \
	else \
		echo "SKIPPED: SPDK tests: no SPDK shared-library build at SPDK_DIR=$(SPDK_DIR) (see docs/target-plugin.md)"; \
	fi

lint:
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings

lab:
	cargo run --release -p qos-lab -- list

bench:
	cargo bench -p qos-core
