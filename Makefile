# Two commands do everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   set up .venv and run `eada demo` (the paper's toy example; no download)
#   make test   set up .venv and run ruff, mypy and the test suite (what CI runs)
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint bench-digits

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev,images,features,fast]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/eada demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -ra

bench-digits: $(STAMP)
	$(BIN)/python benchmarks/digits.py --seeds 0-2
