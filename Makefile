# Two commands on a fresh machine: `make demo` and `make test`. Each sets up what it needs.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

export HORUS_HOME ?= $(CURDIR)/.horus
export AIRFLOW_HOME ?= $(HORUS_HOME)/airflow
export AIRFLOW__CORE__DAGS_FOLDER ?= $(CURDIR)/dags
export AIRFLOW__CORE__LOAD_EXAMPLES ?= False
export MLFLOW_DISABLE_TELEMETRY ?= true
export HORUS_PROJECT_ROOT ?= $(CURDIR)
export AIRFLOW__CORE__PLUGINS_FOLDER ?= $(CURDIR)/plugins

.PHONY: install system-deps demo test test-fast audit evaluate clean

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -r requirements.txt
	$(BIN)/pip install --quiet --no-deps -e .
	touch $(STAMP)

# Without an NVIDIA GPU (and no HORUS_LOCAL_GPUS) the demo declares two A100s for placement; the jobs then train on the CPU.
demo: $(STAMP)
	$(BIN)/python model_registry/bootstrap.py
	$(BIN)/horus demo --dags-folder dags

# Every placement profile on Philly traces with measured ground truth (docs/EVALUATION.md), about 6 min.
evaluate: $(STAMP)
	$(BIN)/python benchmarks/evaluate.py --out docs/evaluation

# Debian packages the tests start: headless Chromium for the UI's browser tests (Playwright's own download
# does not work here), PostgreSQL and Redis (the Celery broker) for the multi-service stack suite (tests/stack).
system-deps:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null && command -v redis-server >/dev/null && ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq chromium chromium-driver postgresql redis-server; }

test: $(STAMP) system-deps
	$(BIN)/python -m pytest -ra $(PYTEST_ARGS)

# What needs no server, browser, Airflow or subprocess: the core's unit tests, in under 3 minutes.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -ra -m "not integration and not airflow and not browser and not stack" $(PYTEST_ARGS)

# pip-audit (its own venv) over .venv. Where no vulnerability database is reachable it says NOT AUDITED
# and succeeds, unless HORUS_AUDIT_REQUIRED=1; known, unfixable vulnerabilities: deploy/audit-ignore.txt.
audit: $(STAMP)
	test -x .audit-venv/bin/pip-audit || { $(PYTHON) -m venv .audit-venv && .audit-venv/bin/pip install --quiet pip-audit==2.10.1; }
	$(BIN)/python deploy/audit.py .audit-venv/bin/pip-audit; status=$$?; \
	  if [ $$status = 3 ] && [ "$${HORUS_AUDIT_REQUIRED:-0}" != 1 ]; then echo "make audit: NOT AUDITED (see above)"; exit 0; fi; exit $$status

clean:
	rm -rf $(HORUS_HOME) .pytest_cache
