# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fatpipe-installed
# The CPU build, installed before the project so pip does not pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
CDKTF_CLI := .tools/node_modules/.bin/cdktf
# A folder of its own: `npm install --no-save` into .tools would prune cdktf-cli as extraneous.
CDKTN_CLI := .tools/cdktn/node_modules/.bin/cdktn
CDKTN_STAMP := $(VENV)/.fatpipe-cdktn-installed
CHECKOV := .tools/checkov/bin/checkov
CHECKOV_VERSION ?= 3.3.30

.PHONY: install install-cdktn cdktf-cli cdktn-cli checkov system-packages demo test test-unit test-system test-loaded lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

# The cdktf CLI (0.21, deprecated upstream but still the reference) in a local folder.
$(CDKTF_CLI):
	@if command -v npm >/dev/null; then \
		npm install --silent --no-save --no-audit --no-fund --prefix .tools cdktf-cli@0.21.0; \
	else echo "npm not found: tests that run the cdktf CLI will be skipped"; fi

cdktf-cli: $(CDKTF_CLI)

# CDK Terrain, the maintained fork (docs/toolkits.md): the `cdktn` extra (its core
# and AWS bindings) and its CLI, so the tests synthesize every stack with both toolkits.
# --no-compile: byte-compiling all of the AWS bindings takes a minute; the few modules a stack
# imports compile on first use instead (about 10 s for the extra, 30 s for the CLI and its Node).
$(CDKTN_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q --no-compile -e '.[dev,cdktn]'
	touch $@

install-cdktn: $(CDKTN_STAMP)

# cdktn-cli 0.24 needs Node >= 22.19: node@22 from npm puts one beside it in .bin, which the tests
# put first on PATH (docs/toolkits.md: `PATH=.tools/cdktn/node_modules/.bin:$PATH cdktn synth`).
$(CDKTN_CLI):
	@if command -v npm >/dev/null; then \
		npm install --silent --no-save --no-audit --no-fund --prefix .tools/cdktn cdktn-cli@0.24.0 node@22; \
	else echo "npm not found: tests that run the cdktn CLI will be skipped"; fi

cdktn-cli: $(CDKTN_CLI)

# checkov (scans the synthesized stacks) in its own venv: its pins stay out of the project's.
$(CHECKOV):
	$(PYTHON) -m venv .tools/checkov
	.tools/checkov/bin/python -m pip install -q "checkov==$(CHECKOV_VERSION)"

checkov: $(CHECKOV)

# The Debian packages the system tests drive for real: namespaces and shaping (iproute2), the SSH
# transport (openssh, rsync), link checks (iperf3), the host firewall (nftables, iptables), the
# user-data schema (cloud-init), the run report in a headless browser (chromium) and the vm provider's
# image and VMs (qemu-system-x86, qemu-utils, debootstrap, cloud-image-utils, e2fsprogs). Installed when
# root; otherwise the missing ones are named and the tests that need them skip.
SYSTEM_PACKAGES := iproute2 openssh-server openssh-client rsync iperf3 nftables iptables cloud-init chromium \
	qemu-system-x86 qemu-utils debootstrap cloud-image-utils e2fsprogs
system-packages:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
		echo "not installed (needs root and apt-get): $$missing; the tests that need them will be skipped"; exit 0; fi; \
	export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && \
	apt-get install -y -qq --no-install-recommends $$missing

# The default cluster end to end: 4 network namespaces shaped to 1 Gbit/s as root, else 4
# loopback nodes. It gates on a quick link check (the full sweep is `fatpipe netcheck`), trains
# the tiny preset briefly (a few minutes on 2 cores), and destroys the cluster at the end, also
# when a phase fails.
DEMO_FLAGS ?= --netcheck quick --preset tiny --steps 60
demo: install
	$(BIN)/fatpipe up --down-after $(DEMO_FLAGS)

lint: install
	$(BIN)/ruff check .

# Everything: lint, the unit tests (seconds, no real processes) and the system tests (real
# terraform, namespaces, sshd, torchrun; minutes).
# Two lanes side by side, so the suite fits CI's time on 2 cores. Not three: the emulated VMs,
# terraform and the timed sim tests all want the CPU, and three lanes on 2 cores ran longer than two
# (83 against 72 minutes) and starved a VM's boot and a link check. The lanes are dealt by a rule
# (tests/lanes.py): the unit tests as one item and each system module, with their seconds measured
# in tests/durations.json, longest first onto the lane with less so far; a module the file lacks
# counts a default. `python3 tests/lanes.py --update OUTPUT` refreshes the file from a run's junit
# XML or its output with LANE_ARGS=--durations=0.
# Every test file uses clusters, namespaces and networks of its own, so the lanes never meet. The
# first lane's output is printed once the second has ended; either lane failing fails the run.
LANE_ONE ?= $(shell $(PYTHON) tests/lanes.py 1)
LANE_TWO ?= $(shell $(PYTHON) tests/lanes.py 2)
LANE_ARGS ?=
test: system-packages install install-cdktn cdktf-cli cdktn-cli checkov lint
	@if [ -z '$(strip $(LANE_ONE))' ] || [ -z '$(strip $(LANE_TWO))' ]; then \
		echo "error: tests/lanes.py named no lanes (tests/durations.json unreadable?)"; exit 2; fi; \
	one=$$(mktemp); trap 'kill $$pid 2>/dev/null; rm -f $$one' EXIT; trap 'exit 130' INT TERM; \
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest -p no:cacheprovider $(LANE_ARGS) $(LANE_ONE) > $$one 2>&1 & pid=$$!; \
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest $(LANE_ARGS) $(LANE_TWO); two=$$?; \
	wait $$pid; first=$$?; echo "===== lane one: $(LANE_ONE)"; cat $$one; \
	echo "===== lane one exit $$first, lane two exit $$two"; [ $$first = 0 ] && [ $$two = 0 ]

test-unit: install
	$(BIN)/pytest -q tests/unit

test-system: system-packages install install-cdktn cdktf-cli cdktn-cli checkov
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest tests/system

# The suite (or PYTEST_ARGS) on a loaded machine, as on a busy CI runner: two CPU-bound processes
# run beside it and are killed at the end whatever happens (failure, Ctrl-C, TERM); each process
# has a time limit besides. E.g. make test-loaded PYTEST_ARGS="-q tests/system/test_trainer.py"
PYTEST_ARGS ?= tests/unit tests/system
LOADED_TIMEOUT_S ?= 7200
test-loaded: system-packages install install-cdktn cdktf-cli cdktn-cli checkov
	@timeout $(LOADED_TIMEOUT_S) $(PYTHON) -c 'while 1: pass' & a=$$!; \
	timeout $(LOADED_TIMEOUT_S) $(PYTHON) -c 'while 1: pass' & b=$$!; \
	trap 'kill $$a $$b 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	PATH="$(CURDIR)/$(BIN):$$PATH" timeout --foreground $(LOADED_TIMEOUT_S) $(BIN)/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .tools cdktf.out build dist *.egg-info
