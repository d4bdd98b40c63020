# Two set-up-and-go commands: `make demo` and `make test`. Both create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP_CORE := $(VENV)/.installed-core
STAMP_DEV := $(VENV)/.installed-dev
DEMO_OUT ?= runs/demo

.PHONY: demo test venv dev clean bench docs docs-cli

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# pip byte-compiles on one core (~29 s for torch here); compileall -j 0 does the same on every core (~10 s on 2).
# Not compiling at all is slower: where PYTHONDONTWRITEBYTECODE is set, every stage process would recompile the torch
# modules it imports (+7 s each). compileall exits 1 on the few files that do not compile (pip skips them too).
SITE = $$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
$(STAMP_CORE): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --no-compile "torch>=2.4,<2.14"
	$(BIN)/pip install -q --no-compile -e .
	$(BIN)/python -m compileall -q -j 0 "$(SITE)" posttrain > /dev/null 2>&1 || true
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
	$(BIN)/ruff check posttrain tests benchmarks tools
	$(BIN)/ruff format --check posttrain tests benchmarks tools
	$(BIN)/python -m pytest tests --durations=15  # the slowest tests, to keep the suite well under 15 min on 2 cores
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet  # broken links, anchors and API references fail

# The docs site (mkdocs + material + mkdocstrings) into site/; open site/index.html.
docs: $(STAMP_DEV)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# Regenerate the CLI reference from the parser (a test fails when docs/reference/cli.md is stale).
docs-cli: $(STAMP_CORE)
	$(BIN)/python -m posttrain.cli_reference > docs/reference/cli.md

clean:
	rm -rf $(VENV) runs .pytest_cache site dist build
