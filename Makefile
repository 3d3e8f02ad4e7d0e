# The README's commands. Every target sets up what it needs: a fresh Debian/Ubuntu machine
# with Python 3.11+, Rust and make is enough.

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP_CACHE_DIR ?= $(HOME)/.cache/pip
export PIP_CACHE_DIR
# Builds are reused across clones and CI runs on this machine.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/magnetar/target
# Debian packages the test suites and the cluster mode need (and a JRE for Spark when
# there is no java).
SYSTEM_PACKAGES := zookeeper
# ... and what only `make bench` adds: the AMQP and MQTT benches' peers, RabbitMQ and Mosquitto.
BENCH_SYSTEM_PACKAGES := rabbitmq-server mosquitto
APT_ENV := DEBIAN_FRONTEND=noninteractive

.PHONY: standalone test bench build venv test-deps sysdeps bench-sysdeps cargo-test lint pytest clean

standalone: build
	$(VENV)/bin/magnetar standalone --config conf/standalone.conf

test: build test-deps sysdeps
	$(MAKE) --no-print-directory cargo-test lint pytest

bench: build test-deps bench-sysdeps
	$(PY) -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]))' > $(VENV)/bench-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/bench-requirements.txt
	$(PY) -m bench

# What the broker needs (make standalone), and on top of it what the tests, Spark and the
# benches need (make test, make bench): a first `make standalone` fetches no PySpark.
venv: $(VENV)/.deps

test-deps: $(VENV)/.test-deps

$(VENV)/.deps: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'maturin>=1.7,<2'
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["dependencies"]))' > $(VENV)/requirements.txt
	$(PY) -m pip install -q -r $(VENV)/requirements.txt
	touch $@

$(VENV)/.test-deps: $(VENV)/.deps
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; print("\n".join(p["optional-dependencies"]["test"] + p["optional-dependencies"]["spark"]))' > $(VENV)/test-requirements.txt
	$(PY) -m pip install -q -r $(VENV)/test-requirements.txt
	touch $@

build: venv
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --quiet

sysdeps:
	@missing=""; \
	for p in $(SYSTEM_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v java >/dev/null 2>&1 || missing="$$missing default-jre-headless"; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO env $(APT_ENV) apt-get install -y -qq $$missing; \
	fi

bench-sysdeps:
	@$(MAKE) --no-print-directory sysdeps SYSTEM_PACKAGES="$(BENCH_SYSTEM_PACKAGES)"

cargo-test:
	cargo test --workspace --exclude magnetar-py --quiet

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy core gateway handlers
	$(PY) -m mypy.stubtest core._native

pytest:
	$(PY) -m pytest -n 2 --dist loadgroup -q

clean:
	rm -rf $(VENV) target
