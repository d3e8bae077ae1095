# The project's commands. `make test` is the test command (README.md); CI runs
# `make lint test` from .ci/run.

SPDK_DIR ?= /opt/spdk
PYTHON ?= python3
VENV ?= .venv

# Tests against a real nvmf_tgt (and SPDK initiators): run only where SPDK is present
# at SPDK_DIR, i.e. every path of spdk-present.list exists there (the same list the test
# harnesses read); elsewhere they print SKIPPED and pass. Where SPDK is present, the
# plugins are built before their tests. (Defined before every recipe that tests it:
# make reads a recipe's ifneq when it parses it.)
SPDK_PRESENT_FILES := $(addprefix $(SPDK_DIR)/,$(shell grep -v '^\#' spdk-present.list))
SPDK_FOUND := $(if $(strip $(foreach f,$(SPDK_PRESENT_FILES),$(if $(wildcard $(f)),,missing))),,yes)

.PHONY: test test-rust test-loom test-rpc test-exporter test-spdk test-install install accept soak fuzz fuzz-cov lint lab bench exporter instrument

test: test-rust test-loom test-rpc test-exporter test-install test-spdk

test-rust:
	cargo test
	cargo test -p qos-fuzz
	cargo run --release -q -p qos-fuzz -- --runs 20000

# The ledger's lock-free parts, model-checked by loom (own target dir: other cfg).
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p qos-core --release --lib loom

# The rpc.py plugin's tests, in a virtualenv with pytest (and the PyPI spdk package,
# whose rpc.py the real-parser tests drive).
test-rpc: $(VENV)/.installed
	$(VENV)/bin/python -m pytest -q rpc-scripts/tests

$(VENV)/.installed: rpc-scripts/requirements-test.txt exporter/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q -r rpc-scripts/requirements-test.txt -r exporter/requirements.txt
	touch $@

# The Prometheus exporter's tests: against a stub JSON-RPC server, a real Prometheus
# (Debian's `prometheus`; skipped, saying so, without it) scraping the exporter, and the
# dashboard's queries against the exporter's metric names; the alert rules in promtool
# fixtures and, loaded into a real Prometheus, firing on a real nvmf_tgt, bdevperf with
# the initiator plugin and the cluster agent (test_alerts_real.py), and unscaled as the
# operator trial of issue 43 met them: a load start, a CPU quota, a hung target
# (test_alerts_trial.py, about 3.5 minutes); and the installed
# systemd units, each ExecStart run from a scratch DESTDIR install with its example
# settings (test_units.py). The tests against a real nvmf_tgt run where SPDK is present
# (see test-spdk's definition below).
test-exporter: $(VENV)/.installed
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin -p nvmf-qos-agent
endif
	$(KEEP_HUGEPAGES) SPDK_DIR="$(SPDK_DIR)" $(VENV)/bin/python -m pytest -q -rs exporter/tests

# Serve the QoS statistics of the SPDK application at RPC_SOCKET for Prometheus.
RPC_SOCKET ?= /var/tmp/spdk.sock
EXPORTER_PORT ?= 9633
exporter: $(VENV)/.installed
	$(VENV)/bin/python exporter/nvmf_qos_exporter.py --rpc-socket $(RPC_SOCKET) --port $(EXPORTER_PORT)


# The SPDK tests reserve hugepages (1024 x 2 MiB) as they need them; the machine gets
# back the number it had when the recipe ends, whether the tests passed or not.
KEEP_HUGEPAGES = hp=$$(cat /proc/sys/vm/nr_hugepages 2>/dev/null); \
	trap 'echo $$hp > /proc/sys/vm/nr_hugepages 2>/dev/null || true' EXIT;

# The integration tests, each test file once: the plugins' and the harness's own tests,
# the target plugin's basic tests (target_qos), the initiator plugin's (initiator-it),
# then the target plugin's long runs: every other file of spdk-plugin/it/tests (the
# cluster, reliability's soak, restart and hostile host; weighted_qos's tests are
# #[ignore]d acceptance runs, see accept).
TARGET_IT_FIRST := target_qos
TARGET_IT_LONG := $(filter-out $(TARGET_IT_FIRST),$(sort $(basename $(notdir $(wildcard spdk-plugin/it/tests/*.rs)))))

test-spdk:
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin -p nvmf-qos-agent
	$(KEEP_HUGEPAGES) \
	SPDK_DIR="$(SPDK_DIR)" cargo test --release -p spdk-sys -p spdk-plugin -p initiator-plugin -p it-harness && \
	SPDK_DIR="$(SPDK_DIR)" cargo test --release -p target-it --lib --bins $(addprefix --test ,$(TARGET_IT_FIRST)) -- --nocapture --test-threads=1 && \
	SPDK_DIR="$(SPDK_DIR)" cargo test --release -p initiator-it -- --nocapture --test-threads=1 && \
	SPDK_DIR="$(SPDK_DIR)" cargo test --release -p target-it $(addprefix --test ,$(TARGET_IT_LONG)) -- --nocapture --test-threads=1
else
	@echo "SKIPPED: SPDK tests: SPDK not present at SPDK_DIR=$(SPDK_DIR): missing $(foreach f,$(SPDK_PRESENT_FILES),$(if $(wildcard $(f)),,$(f))) (spdk-present.list; see docs/target-plugin.md)"
	SPDK_DIR="$(SPDK_DIR)" cargo test -p it-harness -p target-it -p initiator-it
endif

# The reliability soak (docs/reliability.md): verify workloads at saturation through QoS
# bdevs with a seeded churn of reconfigurations, resets and disconnections, then an audit
# (no failed, lost, duplicated or corrupted I/O, token books balanced, RSS flat).
# `make test` runs it for 60 s with the restart and hostile-host tests; this runs it for
# SOAK_SECS (default 600) with churn seed SOAK_SEED.
SOAK_SECS ?= 600
SOAK_SEED ?= 1
soak:
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin
	$(KEEP_HUGEPAGES) SOAK_SECS=$(SOAK_SECS) SOAK_SEED=$(SOAK_SEED) SPDK_DIR="$(SPDK_DIR)" \
	cargo test --release -p target-it --test reliability soak_with_churn -- --nocapture --test-threads=1
else
	@echo "SKIPPED: the soak needs SPDK at SPDK_DIR=$(SPDK_DIR)"
endif

# Fuzzing (docs/reliability.md): every parser reachable from outside, FUZZ_RUNS inputs
# per target (`make test` runs 20,000). The vendor-command, credit, state-reply and
# scenario targets build anywhere; the plugins' RPC-parameter targets where SPDK is.
FUZZ_RUNS ?= 1000000
fuzz:
	cargo run --release -p qos-fuzz -- --runs $(FUZZ_RUNS)
ifneq ($(SPDK_FOUND),)
	FUZZ_RUNS=$(FUZZ_RUNS) SPDK_DIR="$(SPDK_DIR)" cargo test --release -p spdk-plugin -p initiator-plugin params_fuzz -- --nocapture
else
	@echo "SKIPPED: the RPC-parameter fuzz targets need SPDK at SPDK_DIR=$(SPDK_DIR)"
endif

# Coverage-guided fuzzing (docs/reliability.md): each libFuzzer target of fuzz/libfuzzer
# (cargo-fuzz, nightly) for FUZZ_SECONDS, one at a time; the plugins' targets where SPDK
# is. Says SKIPPED where the nightly toolchain or cargo-fuzz is missing. Crash inputs go
# to fuzz/regressions/<target>/, which `cargo test -p qos-fuzz` and the plugins' tests
# replay.
FUZZ_SECONDS ?= 60
fuzz-cov:
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SPDK=$(if $(SPDK_FOUND),1,0) SPDK_DIR="$(SPDK_DIR)" fuzz/libfuzzer/run

# The issue-12 acceptance thresholds on a real nvmf_tgt (weighted shares within 10%,
# reservations in 99% of periods, ...): run on a quiet machine, where SPDK is present.
accept:
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin -p nvmf-qos-agent
	$(KEEP_HUGEPAGES) NVMF_QOS_ACCEPTANCE=1 SPDK_DIR="$(SPDK_DIR)" cargo test --release -p target-it --test weighted_qos -- --ignored --nocapture --test-threads=1; \
	NVMF_QOS_ACCEPTANCE=1 SPDK_DIR="$(SPDK_DIR)" cargo test --release -p target-it --test cluster -- --nocapture
else
	@echo "SKIPPED: acceptance runs need SPDK at SPDK_DIR=$(SPDK_DIR)"
endif

# The instrument of issue 38 (docs/benchmarks.md, "The instrument (issue 38)"): one
# bdevperf run flipped every second between the domain's bypass (A) and the
# configuration under test (B), B/A with a bootstrap interval, the speed-independent
# ratios, then the QoS against bare in 5-s phases. Its QOS_IT_* knobs pass through the
# environment. Runs where SPDK is present.
instrument:
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin -p nvmf-qos-agent
	$(KEEP_HUGEPAGES) SPDK_DIR="$(SPDK_DIR)" \
	cargo test --release -p target-it --test instrument toggle_instrument -- --ignored --nocapture --test-threads=1
else
	@echo "SKIPPED: the instrument needs SPDK at SPDK_DIR=$(SPDK_DIR)"
endif

lint:
	cargo fmt --all --check
	$(PYTHON) qos-core/tools/import_circles.py qos-core/src
	cargo fmt --manifest-path fuzz/libfuzzer/Cargo.toml --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy -p it-harness -p target-it -p initiator-it -p qos-fuzz --all-targets -- -D warnings
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo clippy -p spdk-sys -p spdk-plugin -p initiator-plugin --all-targets -- -D warnings
# The plugins as the coverage-guided fuzz binary links them (fuzz/libfuzzer).
	SPDK_DIR="$(SPDK_DIR)" cargo clippy -p spdk-plugin -p initiator-plugin --features fuzzing -- -D warnings
endif

lab:
	cargo run --release -p qos-lab -- list

# The core's criterion benchmarks, then (where SPDK is present) the side-by-side
# harnesses: the target's (bare nvmf_tgt, SPDK's passthru and the plugin in one run, and
# the plugin's limits against bdev_set_qos_limit) and the initiator's (plain bdev_nvme,
# the QoS bdev's layer, the token protocol, the defaults) (docs/benchmarks.md).
# BENCH_ROUNDS x BENCH_SECS.
BENCH_ROUNDS ?= 5
BENCH_SECS ?= 5
bench:
	cargo bench -p qos-core --bench admission --bench monitor_tick --bench handover
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin
	$(KEEP_HUGEPAGES) SPDK_DIR="$(SPDK_DIR)" cargo run --release -p target-it --bin target-bench -- $(BENCH_ROUNDS) $(BENCH_SECS)
	$(KEEP_HUGEPAGES) SPDK_DIR="$(SPDK_DIR)" cargo run --release -p initiator-it --bin initiator-bench -- $$(( $(BENCH_ROUNDS) < 9 ? 9 : $(BENCH_ROUNDS) )) 3
else
	@echo "SKIPPED: target-bench and initiator-bench: SPDK not present at SPDK_DIR=$(SPDK_DIR)"
endif

# Installation (docs/operations.md, "Install"): the agent, the plugins (where SPDK is
# found), the rpc.py plugin and the exporter with a virtualenv of its pinned
# dependencies (INSTALL_PYTHON_DEPS=0: the venv without them), the alert rules (their
# runbook links pointing at RUNBOOK_URL, the installed operations.md unless given) and
# the dashboard, the docs, systemd units for nvmf_tgt with the plugin, the exporter and
# the agent, and for each unit a commented example of its settings in
# SYSCONFDIR/default (an existing file is kept; the example goes beside it as
# NAME.example), plus an empty saved config for the target where there is none. PREFIX
# and DESTDIR as usual; UNITDIR for the units, SYSCONFDIR for /etc.
PREFIX ?= /usr/local
DESTDIR ?=
UNITDIR ?= /etc/systemd/system
SYSCONFDIR ?= /etc
INSTALL_PYTHON_DEPS ?= 1
BINDIR = $(PREFIX)/bin
LIBDIR = $(PREFIX)/lib/nvmf-qos
DATADIR = $(PREFIX)/share/nvmf-qos
DOCDIR = $(PREFIX)/share/doc/nvmf-qos
RUNBOOK_URL ?= file://$(DOCDIR)/operations.md
UNITS = spdk-plugin/systemd/nvmf-qos-target.service.in exporter/systemd/nvmf-qos-exporter.service.in \
	cluster-agent/systemd/nvmf-qos-agent.service.in
DEFAULTS = spdk-plugin/systemd/nvmf-qos-target.default exporter/systemd/nvmf-qos-exporter.default \
	cluster-agent/systemd/nvmf-qos-agent.default
SUBST = sed -e 's|@LIBDIR@|$(LIBDIR)|g' -e 's|@BINDIR@|$(BINDIR)|g' -e 's|@DOCDIR@|$(DOCDIR)|g' \
	-e 's|@SYSCONFDIR@|$(SYSCONFDIR)|g' -e 's|@DATADIR@|$(DATADIR)|g'

install:
	cargo build --release -p nvmf-qos-agent
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR)/exporter $(DESTDIR)$(LIBDIR)/rpc-scripts \
		$(DESTDIR)$(DATADIR) $(DESTDIR)$(DOCDIR) $(DESTDIR)$(UNITDIR) \
		$(DESTDIR)$(SYSCONFDIR)/default $(DESTDIR)$(SYSCONFDIR)/nvmf-qos
	install -m 755 target/release/nvmf-qos-agent $(DESTDIR)$(BINDIR)/
ifneq ($(SPDK_FOUND),)
	SPDK_DIR="$(SPDK_DIR)" cargo build --release -p spdk-plugin -p initiator-plugin
	install -m 755 target/release/libnvmf_qos_tgt.so target/release/libnvmf_qos_ini.so $(DESTDIR)$(LIBDIR)/
else
	@echo "SKIPPED: the plugins need SPDK at SPDK_DIR=$(SPDK_DIR); installed everything else"
endif
	install -m 644 rpc-scripts/qos_rpc.py $(DESTDIR)$(LIBDIR)/rpc-scripts/
	install -D -m 644 rpc-scripts/schema/target.json $(DESTDIR)$(LIBDIR)/rpc-scripts/schema/target.json
	install -m 644 exporter/nvmf_qos_exporter.py exporter/requirements.txt exporter/requirements.lock \
		$(DESTDIR)$(LIBDIR)/exporter/
	install -m 644 dashboards/nvmf-qos.json dashboards/provisioning.yaml $(DESTDIR)$(DATADIR)/
	sed -e 's|runbook: "docs/operations.md#|runbook: "$(RUNBOOK_URL)#|' dashboards/alerts.yml \
		> $(DESTDIR)$(DATADIR)/alerts.yml
	$(SUBST) dashboards/prometheus.yml.in > $(DESTDIR)$(DATADIR)/prometheus.yml
	install -m 644 docs/*.md CHANGELOG.md LICENSE $(DESTDIR)$(DOCDIR)/
	for u in $(UNITS); do \
		$(SUBST) $$u > $(DESTDIR)$(UNITDIR)/$$(basename $$u .in) || exit 1; \
	done
	for f in $(DEFAULTS); do \
		out=$(DESTDIR)$(SYSCONFDIR)/default/$$(basename $$f .default); \
		if [ -e $$out ]; then echo "kept $$out; the example is $$out.example"; out=$$out.example; fi; \
		$(SUBST) $$f > $$out || exit 1; \
	done
	test -e $(DESTDIR)$(SYSCONFDIR)/nvmf-qos/target.json || \
		echo '{"subsystems": []}' > $(DESTDIR)$(SYSCONFDIR)/nvmf-qos/target.json
	$(PYTHON) -m venv --clear $(DESTDIR)$(LIBDIR)/venv
ifeq ($(INSTALL_PYTHON_DEPS),1)
	$(DESTDIR)$(LIBDIR)/venv/bin/pip install -q --require-hashes -r exporter/requirements.lock
endif
ifneq ($(DESTDIR),)
# The venv's scripts (pip's shebang, activate) and pyvenv.cfg name it where it was made:
# where it is installed instead.
	grep -rlI -- '$(DESTDIR)' $(DESTDIR)$(LIBDIR)/venv/bin $(DESTDIR)$(LIBDIR)/venv/pyvenv.cfg \
		| xargs -r sed -i 's|$(DESTDIR)||g'
endif
	@echo "installed under $(DESTDIR)$(PREFIX), units in $(DESTDIR)$(UNITDIR): see docs/operations.md, Install"

# `make install` into a scratch prefix: every file in place, and systemd-analyze verify
# (systemd's own checker: syntax, and that each ExecStart exists) on the units.
test-install:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	$(MAKE) --no-print-directory install PREFIX=$$tmp/usr UNITDIR=$$tmp/units SYSCONFDIR=$$tmp/etc \
		INSTALL_PYTHON_DEPS=0 > $$tmp/log 2>&1 || { cat $$tmp/log; exit 1; } && \
	for f in usr/bin/nvmf-qos-agent usr/lib/nvmf-qos/rpc-scripts/qos_rpc.py usr/lib/nvmf-qos/rpc-scripts/schema/target.json \
		usr/lib/nvmf-qos/exporter/nvmf_qos_exporter.py usr/lib/nvmf-qos/venv/bin/python \
		usr/share/nvmf-qos/alerts.yml usr/share/nvmf-qos/nvmf-qos.json usr/share/doc/nvmf-qos/operations.md \
		usr/share/nvmf-qos/prometheus.yml etc/default/nvmf-qos-target etc/default/nvmf-qos-exporter etc/default/nvmf-qos-agent \
		etc/nvmf-qos/target.json \
		$(if $(SPDK_FOUND),usr/lib/nvmf-qos/libnvmf_qos_tgt.so usr/lib/nvmf-qos/libnvmf_qos_ini.so); do \
		test -e $$tmp/$$f || { echo "make install did not install $$f"; exit 1; }; \
	done && \
	for u in $$tmp/units/*.service; do \
		grep -q "^EnvironmentFile=-$$tmp/etc/default/$$(basename $$u .service)$$" $$u \
			|| { echo "$$u does not read $$tmp/etc/default/$$(basename $$u .service)"; exit 1; }; \
	done && \
	if command -v promtool > /dev/null; then promtool check config $$tmp/usr/share/nvmf-qos/prometheus.yml \
		> $$tmp/log 2>&1 || { cat $$tmp/log; exit 1; }; fi && \
	if grep -n 'runbook: "' $$tmp/usr/share/nvmf-qos/alerts.yml | grep -v "runbook: \"file://$$tmp/usr/share/doc/nvmf-qos/operations.md#"; then \
		echo "installed alerts.yml: a runbook link that is not the installed operations.md"; exit 1; fi && \
	$(MAKE) --no-print-directory install PREFIX=$$tmp/usr UNITDIR=$$tmp/units SYSCONFDIR=$$tmp/etc \
		INSTALL_PYTHON_DEPS=0 > $$tmp/log 2>&1 || { cat $$tmp/log; exit 1; } && \
	test -e $$tmp/etc/default/nvmf-qos-target.example || { echo "a second install did not keep the settings"; exit 1; } && \
	if command -v systemd-analyze > /dev/null; then \
		for u in $$tmp/units/*.service; do \
			out=$$(systemd-analyze verify $$u 2>&1 | grep -v 'sysinit.target\|multi-user.target\|network-online.target'); \
			if [ -n "$$out" ]; then echo "$$u: $$out"; exit 1; fi; \
		done; echo "make install: files in place, $$(ls $$tmp/units | wc -l) units verified by systemd-analyze"; \
	else echo "SKIPPED: systemd-analyze not found: the units were installed, not verified"; fi

