# The two commands a newcomer needs: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: run test lint ruff typecheck suite timing bench lock clean

# The venv's packages are installed by uv (itself a wheel pip fetches): it resolves
# and installs the dev set in about 7 s where pip takes about 25. uv does not read
# pip's configuration, so pip's package index (PIP_INDEX_URL or pip.conf's
# global.index-url, as a mirror in mainland China is) and certificate bundle
# (PIP_CERT or global.cert, behind a TLS-inspecting proxy) are handed to it; if uv
# still cannot install, pip does. Bytecode is compiled at install, as pip does: where
# PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile each module
# it imports, every time.
$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet 'uv>=0.5'

PIP_SETTING = $${$(1):-$$($(BIN)/python -m pip config get global.$(2) 2>/dev/null)}
INSTALL = index=$(call PIP_SETTING,PIP_INDEX_URL,index-url); \
	cert=$${SSL_CERT_FILE:-$(call PIP_SETTING,PIP_CERT,cert)}; \
	if [ -n "$$index" ]; then export UV_DEFAULT_INDEX="$$index"; fi; \
	if [ -n "$$cert" ]; then export SSL_CERT_FILE="$$cert"; fi; \
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python $(1) || { \
	echo "uv could not install: pip does instead"; $(BIN)/python -m pip install --quiet $(1); }

$(VENV)/.local: pyproject.toml | $(BIN)/python
	$(call INSTALL,-e '.[local]')
	@touch $@

DEV_EXTRAS := .[dev,bench]
$(VENV)/.dev: pyproject.toml | $(BIN)/python
	$(call INSTALL,-e '$(DEV_EXTRAS)')
	@touch $@ $(VENV)/.local

run: $(VENV)/.local
	STUDIO_DEMO_UPSTREAM=$${STUDIO_DEMO_UPSTREAM:-1} \
	STUDIO_PAYMENTS_FAKE=$${STUDIO_PAYMENTS_FAKE:-1} $(BIN)/python -m service dev

lint: $(VENV)/.dev ruff typecheck

ruff: $(VENV)/.dev
	$(BIN)/ruff check service tests bench scripts
	$(BIN)/ruff format --check service tests bench scripts
	$(BIN)/python scripts/check_imports.py

typecheck: $(VENV)/.dev
	$(BIN)/mypy

# The suite on TEST_WORKERS processes (pytest-xdist): its tests mostly wait on
# servers and child processes, so more workers than cores pays. --dist loadscope
# keeps each module on one worker: its module-scoped servers (Chromium, nginx,
# weed mini, the fuzzed app, the built wheel) start once, and nothing else
# flushes their Redis in the middle of the module. --no-loadscope-reorder hands
# modules out in the order tests/conftest.py sets (the longest first) rather
# than by their number of tests. The tests marked `timing` assert wall-clock
# budgets: they run afterwards on two processes, collected only from the
# modules that mark one (collecting all 1,460 tests to deselect most costs
# seconds). mypy runs beside them rather than beside the suite: they mostly
# wait out real timeouts (each process starts with one that waits 10 s on a
# thousand held connections), and they are built to keep their budgets with
# the other core busy (bench/soak.sh holds it busy through the whole suite),
# while the suite needs both cores. bench/soak.sh runs `make test`'s pytest
# steps.
TEST_WORKERS ?= 4
XDIST := --dist loadscope --no-loadscope-reorder
TIMING_MODULES = $(shell grep -l 'mark.timing' tests/test_*.py)
# The suite starts about 200 `serve`, `worker` and operator processes: the
# project's own bytecode is compiled once first (0.3 s) rather than by each.
test: ruff
	@$(BIN)/python -m compileall -q -j0 service tests > /dev/null
	$(MAKE) --no-print-directory suite
	$(MAKE) --no-print-directory -j2 typecheck timing

suite: $(VENV)/.dev
	$(BIN)/pytest -n $(TEST_WORKERS) $(XDIST) -m "not timing"

timing: $(VENV)/.dev
	$(BIN)/pytest -n 2 $(XDIST) -m timing $(TIMING_MODULES)

bench: $(VENV)/.dev
	$(BIN)/python bench/documents.py
	$(BIN)/python bench/square.py
	$(BIN)/python bench/jobs.py
	$(BIN)/python bench/positions.py

# requirements.lock: every runtime dependency pinned with its hashes, for any Linux
# (x86_64, aarch64) and Python 3.11+, as the image installs it (--require-hashes).
# Keeps existing pins; `make lock LOCK_FLAGS=--upgrade` moves them to the newest.
lock: | $(BIN)/python
	$(BIN)/pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml --universal --python-version 3.11 \
		--generate-hashes --custom-compile-command 'make lock' $(LOCK_FLAGS) \
		--output-file requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
