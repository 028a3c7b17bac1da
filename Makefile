# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	# The CPU build of torch first: an open range could pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/polyrhythm compare

# Debian's chromium for the report's browser test, when missing and root can apt-get it.
test: $(STAMP)
	@sh scripts/install-chromium
	$(BIN)/lint-imports
	$(BIN)/python scripts/suite

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/script.py
	$(BIN)/python benchmarks/compression.py
	$(BIN)/python benchmarks/collectives.py
	$(BIN)/python benchmarks/instrumentation.py
	$(BIN)/python benchmarks/face.py
	$(BIN)/python benchmarks/switch.py
	$(BIN)/python benchmarks/cluster.py
	$(BIN)/python benchmarks/simulator.py

clean:
	rm -rf $(VENV) runs .pytest_cache
