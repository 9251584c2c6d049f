# One command per task; .ci/run calls the same targets as the README.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.install.stamp

.PHONY: install install-runtime serve test test-deep redis node-modules lint typecheck bench examples openapi client-types check clean

RUNTIME_STAMP := $(VENV)/.runtime.stamp

# install-runtime: the service and the Python client, what `make serve` needs. install: also the
# test, lint and benchmark tools, the providers' SDKs and the agent runtimes of the adapters.
install-runtime: $(RUNTIME_STAMP)

install: $(STAMP)

$(RUNTIME_STAMP): pyproject.toml clients/python/pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e . -e clients/python
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	$(BIN)/pip install --quiet -e '.[dev,otel]' -e 'clients/python[langchain,pydantic-ai,openai-agents]'
	touch $(STAMP)

serve: install-runtime
	$(BIN)/context-assembly serve

# The TypeScript client's packages come first: the examples test runs its AI SDK example.
# Coverage is of the service package in the test process (the served processes of e2e/ and
# integrations/ are not traced); the run fails under COVERAGE_FLOOR, today's figure rounded
# down: raise it when the tests reach more, never lower it to pass.
COVERAGE_FLOOR := 93
test: install redis node-modules
	$(BIN)/pytest -q --cov=context_assembly --cov-report=term:skip-covered --cov-fail-under=$(COVERAGE_FLOOR)
	cd clients/typescript && npm test --silent

node-modules:
	cd clients/typescript && npm ci --silent --no-audit --no-fund

# The property, fuzz and state-machine tests with DEEP_SCALE times CI's examples, drawn at random
# (tests/hypothesis_budget.py), with the rest of the suite: a bug hunt, not part of CI (several
# minutes at scale 10 on a two-core machine).
DEEP_SCALE ?= 10
test-deep: install redis
	CA_EXAMPLES_SCALE=$(DEEP_SCALE) $(BIN)/pytest -q -p no:cacheprovider

# The tests need a real Redis on 127.0.0.1:6379: find it or start it, and fail loudly otherwise.
redis:
	@bash .ci/ensure-redis

# ruff, then vulture for dead code ([tool.vulture] in pyproject.toml, vulture_whitelist.py).
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/vulture

# mypy strict on the service and the Python client (pyproject.toml), then on the tests with the
# same checks less the demand that every function be annotated. The tests run one directory at a
# time: each has its own conftest.py, and pytest puts the directory on sys.path for its helpers.
TESTS_MYPY := $(BIN)/mypy --explicit-package-bases --allow-untyped-defs --allow-incomplete-defs \
	--allow-untyped-calls --cache-dir .mypy_cache/tests
typecheck: install
	$(BIN)/mypy
	MYPYPATH=tests $(TESTS_MYPY) $(wildcard tests/*.py)
	@set -e; for dir in $(sort $(dir $(wildcard tests/*/*.py))); do \
		echo "mypy $$dir"; MYPYPATH=tests:$$dir $(TESTS_MYPY) $$dir; \
	done

bench: install
	$(BIN)/python bench/run_all.py

examples: install node-modules
	$(BIN)/python examples/run_all.py

# The document, then both clients' types made from it (tests fail when either drifts).
openapi: install node-modules
	$(BIN)/python -m context_assembly.api.openapi_export openapi/openapi.json
	$(MAKE) --no-print-directory client-types
	cd clients/typescript && npm run gen-types --silent

# The Python client's models from the committed document, with the options of
# [tool.datamodel-codegen] in clients/python/pyproject.toml.
client-types: install
	cd clients/python && $(CURDIR)/$(BIN)/datamodel-codegen

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis .coverage
