# Two set-up-and-go commands: `make demo` and `make test`. Both create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_CORE := $(VENV)/.installed-core
STAMP_DEV := $(VENV)/.installed-dev
DEMO_OUT ?= runs/demo

.PHONY: demo test venv dev clean bench

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# --no-compile: pip would byte-compile all of torch (~20 s of the demo's set-up on 2 cores); Python compiles the
# modules a run imports on first use instead (a few seconds, once).
$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --no-compile "torch>=2.4,<2.14"
	$(BIN)/pip install -q --no-compile -e .
	touch $@

$(STAMP_DEV): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q "torch>=2.4,<2.14"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@ $(STAMP_CORE)

venv: $(STAMP_CORE)

dev: $(STAMP_DEV)

demo: $(STAMP_CORE)
	$(BIN)/posttrain pipeline --preset tiny --jobs 2 --out $(DEMO_OUT)

test: $(STAMP_DEV)
	$(BIN)/ruff check posttrain tests benchmarks
	$(BIN)/ruff format --check posttrain tests benchmarks
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) runs .pytest_cache
