# One command per task; .ci/run calls the same targets as the README.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install.stamp

.PHONY: install serve test test-deep redis lint typecheck bench examples openapi check clean

install: $(STAMP)

$(STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e clients/python
	touch $(STAMP)

serve: install
	$(BIN)/context-assembly serve

test: install redis
	$(BIN)/pytest -q
	cd clients/typescript && npm ci --silent --no-audit --no-fund && npm test --silent

# The property, fuzz and state-machine tests with DEEP_SCALE times CI's examples, drawn at random
# (tests/hypothesis_budget.py), with the rest of the suite: a bug hunt, not part of CI (9 minutes
# at scale 10 on the project machine, all passed on 2026-12-04).
DEEP_SCALE ?= 10
test-deep: install redis
	CA_EXAMPLES_SCALE=$(DEEP_SCALE) $(BIN)/pytest -q -p no:cacheprovider

# The tests need a real Redis on 127.0.0.1:6379: find it or start it, and fail loudly otherwise.
redis:
	@bash .ci/ensure-redis

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

bench: install
	$(BIN)/python bench/bench_select.py
	$(BIN)/python bench/bench_counting.py
	$(BIN)/python bench/bench_cache.py
	$(BIN)/python bench/bench_fanout.py
	$(BIN)/python bench/bench_inprocess.py
	$(BIN)/python bench/bench_service.py
	$(BIN)/python bench/bench_load.py

examples: install
	$(BIN)/python examples/run_all.py

openapi: install
	$(BIN)/python -m context_assembly.api.openapi_export openapi/openapi.json

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
