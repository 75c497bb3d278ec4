# fabriclab: `make demo` runs the main job, `make test` runs the tests. Both set themselves up (as root).
VENV ?= .venv
PY := $(VENV)/bin/python
FABRICLAB := $(VENV)/bin/fabriclab

.PHONY: setup demo test test-unit test-integration lint bench clean help vm vm-test vm-shell vm-run

help:
	@echo "make demo   - set up, then run the main demo on the default leaf-spine fabric"
	@echo "make test   - set up, then run the whole test suite (unit + integration, needs root)"
	@echo "make setup  - apt packages, venv ($(VENV)), Open vSwitch started (idempotent)"
	@echo "make lint   - ruff"
	@echo "make bench  - transport benchmark (JSON)"
	@echo "make clean  - remove anything fabriclab left running (namespaces, bridges, processes)"
	@echo "make vm       - build the VM image (Debian 12 from Debian's packages, provisioned by setup.sh; cached)"
	@echo "make vm-test  - boot the VM with qemu and run the kernel-datapath, netem and teardown checks inside"
	@echo "make vm-shell - boot the VM with a root shell on this terminal (the working tree in /opt/fabriclab)"
	@echo "make vm-run CMD='fabriclab bench fabric --quick' - boot the VM, run one command inside, power off"

setup:
	@bash scripts/setup.sh

demo: setup
	$(FABRICLAB) demo

test: setup
	$(VENV)/bin/ruff check topologies emulator transport experiments live labs cli tests scripts
	$(PY) -m pytest -q --durations=15

test-unit: setup
	$(PY) -m pytest -q -m "not root"

test-integration: setup
	$(PY) -m pytest -q -m root

lint: setup
	$(VENV)/bin/ruff check topologies emulator transport experiments live labs cli tests scripts

bench: setup
	$(FABRICLAB) bench transport --json

clean:
	@if [ -x $(FABRICLAB) ]; then $(FABRICLAB) clean; fi

vm:
	@bash scripts/vm/build.sh

vm-test:
	@bash scripts/vm/run.sh test

vm-shell:
	@bash scripts/vm/run.sh shell

vm-run:
	@bash scripts/vm/run.sh run $(CMD)
