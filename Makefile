# make run  - the whole system (web, worker, beat, sandbox) on embedded PostgreSQL and Redis
# make test - the test suite against the same embedded services
# make demo - N deposits through the sandbox with faults on; prints a summary line
# make chaos - a seeded, randomized fault campaign (CHAOS_ARGS="--seed 17 --seeds 1")
# make bench - every bench/<part>.py (saga vs DBOS, periodic, ingest, releases) on its own
#              embedded PostgreSQL with fsync=on (.devservices-bench, ports 54339/63809),
#              interleaved rounds (BENCH_ARGS="--rounds 3"); last line: bench: key=value ...
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV := $(BIN)/python -m corridor.devservices

.PHONY: run test demo chaos bench lint clean-devservices

$(STAMP): requirements.txt requirements-dev.txt
	@command -v $(PY) >/dev/null 2>&1 || { echo "need $(PY) (Python 3.11) on PATH, or run: make PY=python3 ..."; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements-dev.txt
	touch $(STAMP)

run: $(STAMP)
	$(DEV) run -- $(BIN)/python scripts/run_dev.py

# Stellar's TypeScript wallet SDK for tests/test_wallet_sdk.py (package-lock.json), when
# npm is installed (README); without it that test skips (and fails under CI=true).
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package-lock.json
	@if command -v npm >/dev/null 2>&1; then npm ci --no-audit --no-fund --loglevel=error && touch $(NODE_STAMP); \
	else echo "npm not found: tests/test_wallet_sdk.py will skip (apt-get install nodejs npm)"; fi

# The suite in TEST_WORKERS processes (pytest-xdist; whole files per worker); 0: one.
TEST_WORKERS ?= 2
test: $(STAMP) $(NODE_STAMP)
	$(DEV) run -- $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

demo: $(STAMP)
	$(DEV) run -- $(BIN)/python manage.py demo $(DEMO_ARGS)

chaos: $(STAMP)
	$(DEV) run -- $(BIN)/python manage.py chaos $(CHAOS_ARGS)

bench: $(STAMP)
	$(BIN)/pip install --quiet -r requirements-bench.txt
	$(BIN)/python bench/run.py $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .

clean-devservices:
	-$(DEV) down
	rm -rf .devservices .devservices-bench
