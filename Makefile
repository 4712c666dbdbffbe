# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.fatpipe-installed
# The CPU build, installed before the project so pip does not pull a multi-GB CUDA build.
TORCH ?= torch==2.13.0
CDKTF_CLI := .tools/node_modules/.bin/cdktf
CHECKOV := .tools/checkov/bin/checkov
CHECKOV_VERSION ?= 3.3.30

.PHONY: install cdktf-cli checkov demo test test-unit test-system lint clean

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

# checkov (scans the synthesized stacks) in its own venv: its pins stay out of the project's.
$(CHECKOV):
	$(PYTHON) -m venv .tools/checkov
	.tools/checkov/bin/python -m pip install -q "checkov==$(CHECKOV_VERSION)"

checkov: $(CHECKOV)

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
test: install cdktf-cli checkov lint
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest tests/unit tests/system

test-unit: install
	$(BIN)/pytest -q tests/unit

test-system: install cdktf-cli checkov
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest tests/system

clean:
	rm -rf $(VENV) .tools cdktf.out build dist *.egg-info
