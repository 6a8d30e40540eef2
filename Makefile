# Two commands do everything on a fresh machine (Python >= 3.10 with venv):
#   make demo   set up .venv and run `eada demo` (the paper's toy example; no download)
#   make test   set up .venv and run ruff, mypy, the docs build and the test suite (what CI runs)
# CPU-only machine: `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` installs torch
# and torchvision from that index first (CPU wheels, no CUDA libraries), the rest from PyPI.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
TORCH_INDEX ?=
EXTRAS ?= dev,images,features,fast,docs,cluster,stats,dataframe

.PHONY: setup demo test lint docs bench-digits

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
ifneq ($(strip $(TORCH_INDEX)),)
	$(BIN)/python -m pip install -q -c constraints.txt --index-url $(TORCH_INDEX) torch torchvision
endif
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[$(EXTRAS)]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/eada demo

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy

# the documentation site into site/ (open site/index.html); --strict: a broken link, a page
# left out of the nav or an API reference that does not resolve fails the build
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the tests on two pytest-xdist workers, the 20 slowest printed, the site `make docs` just built
# read instead of built again (EADA_DOCS_SITE; without it the first worker builds it, under a
# lock, for both: tests/conftest.py); `make test PYTEST_ARGS=` runs them in one process
PYTEST_ARGS ?= -n 2
test: lint docs
	EADA_DOCS_SITE=site $(BIN)/python -m pytest -ra --durations=20 $(PYTEST_ARGS)

bench-digits: $(STAMP)
	$(BIN)/python benchmarks/digits.py --seeds 0-2
