# fabriclab: `make demo` runs the main job, `make test` runs the tests. Both set themselves up (as root).
# The venv: .venv, unless setup was told otherwise once (the Vagrant VM's /opt/fabriclab-venv, remembered in
# /etc/fabriclab/setup.conf; see scripts/setup.sh).
FABRICLAB_SETUP_CONF ?= /etc/fabriclab/setup.conf
VENV ?= $(or $(shell sed -n 's/^VENV=//p' $(FABRICLAB_SETUP_CONF) 2>/dev/null | tail -1),.venv)
PY := $(VENV)/bin/python
FABRICLAB := $(VENV)/bin/fabriclab

.PHONY: setup demo test test-unit test-integration lint bench clean help vm vm-test vm-shell vm-run wheelhouse \
	vagrant-test vagrant-results docs

help:
	@echo "make demo   - set up, then run the main demo on the default leaf-spine fabric"
	@echo "              (ARGS='--duration 3 --arms spray' for a short one; fabriclab demo --help)"
	@echo "make test   - set up, then run the whole test suite (unit + integration, needs root)"
	@echo "make setup  - apt packages, venv ($(VENV)), Open vSwitch started (idempotent)"
	@echo "make lint   - ruff"
	@echo "make bench  - transport benchmark (JSON)"
	@echo "make docs   - build the documentation site from docs/ into site/ (MkDocs, strict: no broken link)"
	@echo "make clean  - remove anything fabriclab left running (namespaces, bridges, processes)"
	@echo "make vm       - build the VM image (Debian 12 from Debian's packages, provisioned by setup.sh; cached)"
	@echo "make vm-test  - boot the VM with qemu and run the kernel-datapath, netem and teardown checks inside"
	@echo "make vm-shell - boot the VM with a root shell on this terminal (the working tree in /opt/fabriclab)"
	@echo "make vm-run CMD='fabriclab bench fabric --quick' - boot the VM, run one command inside, power off"
	@echo "make vagrant-results - copy the Vagrant VM's results/ into this folder's results/"
	@echo "make vagrant-test    - the README's Vagrant commands, run as written on libvirt with a local box"
	@echo "make wheelhouse      - download the Python packages into wheelhouse/ (setup then installs offline)"

setup:
	@VENV=$(VENV) FABRICLAB_SETUP_CONF=$(FABRICLAB_SETUP_CONF) bash scripts/setup.sh

demo: setup
	$(FABRICLAB) demo $(ARGS)

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

# MkDocs and its Material theme are among the test tools that setup installs (pyproject.toml's test extra).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

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

wheelhouse:
	@bash scripts/vagrant/wheelhouse.sh wheelhouse

vagrant-results:
	@bash scripts/vagrant/results.sh

vagrant-test:
	@bash scripts/vagrant/test.sh
