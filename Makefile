# The two commands a new user runs:
#   make demo   set up, then run the main job
#   make test   set up, start the Docker engine, run the tests
#   (make test-fast: the tests that need neither Docker nor Ray, nor take long)
PYTHON ?= python3.11
VENV   := .venv
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast test-docker test-ray bench clean

setup: $(STAMP)

# torch comes first, from the pinned CPU build, and constraints.txt keeps every later
# install from replacing it. DeepSpeed compiles no ops here (DS_BUILD_OPS=0) and needs
# the installed torch at build time (--no-build-isolation).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip setuptools wheel
	$(VENV)/bin/pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(VENV)/bin/pip install --quiet --no-build-isolation -c constraints.txt deepspeed
	$(VENV)/bin/pip install --quiet -c constraints.txt -e '.[dev]'
	$(VENV)/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	$(VENV)/bin/python -m harness.codex_cli.install
	touch $(STAMP)

demo: setup
	bash scripts/ensure-docker.sh
	$(VENV)/bin/relearn demo

test: setup
	bash scripts/ensure-docker.sh
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q

# Pieces of the suite (markers in pyproject.toml, applied in tests/conftest.py). test-fast needs
# neither the Docker engine nor Ray; CI runs `make test`, which is all of it.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q -m "not docker and not ray and not slow"

test-docker: setup
	bash scripts/ensure-docker.sh
	$(VENV)/bin/python -m pytest -q -m "docker and not ray"

test-ray: setup
	bash scripts/ensure-docker.sh
	$(VENV)/bin/python -m pytest -q -m ray

bench: setup
	$(VENV)/bin/python bench/bench_import.py
	bash scripts/ensure-docker.sh
	$(VENV)/bin/python bench/bench_envs.py
	$(VENV)/bin/python bench/bench_masks.py
	$(VENV)/bin/python bench/bench_export.py
	$(VENV)/bin/python bench/bench_harness.py

clean:
	rm -rf $(VENV) .pytest_cache runs
