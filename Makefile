# The two commands a newcomer runs: `make demo` and `make test` (see README.md).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# Two test commands (docs/demo-and-tests.md): `make test`, the landing gate CI runs (each
# property proven once on its road, under 15 minutes on 2 cores), and `make test-all`, the
# whole proof (the gate and every test marked `whole`: the shape and fault matrices, the
# deployments' stories, each benchmark run whole), which an issue passes before it is resolved.
# Test selection within either: `make test MARK=unit` runs the fast tier only.
MARK ?=
PYTEST_ARGS ?=
# Test processes (pytest-xdist): one per core by default; WORKERS=0 runs every test in this one.
# The tests of a module that share a module fixture stay on one worker (it is built once);
# every other test goes to whichever worker is free, the slowest tiers first (in collection
# order: xdist would otherwise hand out the modules with the most tests first and the single
# long DAG tests last).
WORKERS ?= auto
# Each checkout keeps its test folders in its own build/ (not /tmp/pytest-of-$USER, where two
# pytest sessions of one user delete each other's folders: a run beside a run fails falsely).
BASETEMP := build/pytest-tmp

.PHONY: demo tour airflow airflow-stop fleet fleet-stop test test-all suite-report lint lock prereqs jars clean wheel

prereqs:
	@scripts/check_prereqs.sh

# First use creates the virtual environment; it is redone only when the pins change.
# The runtime set (requirements.txt, what the image has too) and the tests', linter's and
# demo's tools (requirements-dev.txt), then the package itself, editable.
$(VENV)/.installed: requirements.txt requirements-dev.txt pyproject.toml
	@echo "Creating $(VENV) and installing pinned dependencies (a few minutes the first time)..."
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@rm -rf include/stateops.egg-info  # a second copy of the metadata: Airflow's plugins twice
	touch $@

# The package (the library and CLI, stateops_airflow, the Spark jobs) as a wheel in dist/:
# `pip install "dist/stateops-VERSION-py3-none-any.whl[airflow,spark,kafka]"` into an
# environment that has its own Airflow and Spark (docs/install.md).
# Built from a copy: setuptools leaves its metadata beside the sources, and a second copy of
# it on the path would have Airflow register the view twice.
wheel: $(VENV)/.installed jars
	@rm -rf dist build/wheel-src && mkdir -p build/wheel-src
	@cp -r pyproject.toml README.md LICENSE include build/wheel-src/
	@mkdir -p build/wheel-src/include/stateops/jars
	@cp build/jars/s3/stateops-checkpoint.jar build/wheel-src/include/stateops/jars/
	@$(PY) -m pip wheel --quiet --no-deps -w dist build/wheel-src
	@ls dist/*.whl

# The library as shipped to Spark executors with --py-files.
build/stateops.zip: $(VENV)/.installed $(shell find include/stateops -name '*.py')
	@mkdir -p build && rm -f $@
	$(PY) -m zipfile -c $@ include/stateops

# Maven artifacts (maven/*/pom.xml) fetched by the machine's mvn into build/jars/, once:
# Spark's Kafka connector and S3 connector (handed to every spark-submit) and the embedded
# broker's jars; then the project's S3 checkpoint file manager, compiled by javac beside them.
jars: $(VENV)/.installed
	@PY=$(PY) scripts/fetch_jars.sh spark broker s3
	@PY=$(PY) scripts/build_checkpoint_jar.sh

# The short story on Kafka (under 10 minutes on 2 cores); `make tour`: the whole lifecycle tour.
demo: prereqs jars $(VENV)/.installed build/stateops.zip
	@scripts/demo.sh

tour: prereqs jars $(VENV)/.installed build/stateops.zip
	@scripts/tour.sh

airflow: prereqs jars $(VENV)/.installed build/stateops.zip
	@scripts/airflow.sh

airflow-stop:
	@scripts/airflow.sh stop

# The production shape on loopback (scripts/fleet.sh): Postgres, Celery with Redis and two
# workers that share no folder, a Spark standalone cluster, Kafka and S3. What it adds to the
# environment (requirements-fleet.txt) is installed on its first use.
$(VENV)/.fleet-installed: $(VENV)/.installed requirements-fleet.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-fleet.txt
	touch $@

fleet: prereqs jars $(VENV)/.fleet-installed build/stateops.zip
	@scripts/fleet.sh

fleet-stop:
	@scripts/fleet.sh stop

# The fleet's tests (tests/e2e/test_fleet.py) run make fleet: its packages are the tests' too.
TEST_NEEDS := prereqs lint jars build/stateops.zip $(VENV)/.fleet-installed
PYTEST := source scripts/env.sh && $(PY) -m pytest -n $(WORKERS) --basetemp=$(BASETEMP) --dist loadgroup --no-loadscope-reorder $(if $(MARK),-m "$(MARK)")

test: $(TEST_NEEDS)
	@scripts/ensure_test_packages.sh
	@$(PYTEST) $(PYTEST_ARGS)

# Also writes build/test-all.json (the commit, the counts, the wall time) when it ends.
test-all: $(TEST_NEEDS)
	@scripts/ensure_test_packages.sh
	@$(PYTEST) --whole-proof $(PYTEST_ARGS)

# Where the suite's time goes (benchmarks/suite_report.py): make test (or SUITE=test-all),
# recording every test's time and CPU, every JVM, spark-submit and Python worker it starts,
# and every shared fixture built; then the report, held against the previous record (kept as
# build/suite-record.prev) or against AGAINST, an earlier run's summary.json.
SUITE_RECORD := build/suite-record
SUITE ?= test
AGAINST ?=
suite-report:
	@if [ -n "$(AGAINST)" ] && [ ! -f "$(AGAINST)" ]; then echo "error: AGAINST=$(AGAINST): no such file (an earlier run's summary.json)" >&2; exit 2; fi
	@rm -rf $(SUITE_RECORD).prev; if [ -d $(SUITE_RECORD) ]; then mv $(SUITE_RECORD) $(SUITE_RECORD).prev; fi
	@mkdir -p $(SUITE_RECORD)
	@STATEOPS_SUITE_RECORD=$(abspath $(SUITE_RECORD)) $(MAKE) --no-print-directory $(SUITE); status=$$?; \
	  against="$(AGAINST)"; \
	  if [ -z "$$against" ] && [ -f $(SUITE_RECORD).prev/summary.json ]; then against=$(SUITE_RECORD).prev/summary.json; fi; \
	  $(PY) benchmarks/suite_report.py $(SUITE_RECORD) $${against:+--against "$$against"}; \
	  exit $$status

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check --quiet include dags plugins tests benchmarks
	$(VENV)/bin/ruff format --check --quiet include dags plugins tests benchmarks

# The runtime set resolved alone in a fresh environment, then the tools on top of it.
lock:
	rm -rf build/lock && python3 -m venv build/lock
	build/lock/bin/pip install --quiet -r requirements.in
	@(echo "# Generated by 'make lock' from requirements.in: the exact set the tests ran with."; \
	  build/lock/bin/pip freeze) > requirements.txt
	build/lock/bin/pip install --quiet -c requirements.txt -r requirements-dev.in
	@(echo "# Generated by 'make lock' from requirements-dev.in: the tests', the linter's and the demo's"; \
	  echo "# tools, the exact set the tests ran with; not in the runtime set or the image."; \
	  build/lock/bin/pip freeze | grep -vxFf requirements.txt) > requirements-dev.txt

# Fault injection (docs/faults.md): each operation killed and run again, many times.
.PHONY: faults
faults: prereqs jars build/stateops.zip
	@source scripts/env.sh && STATEOPS_FAULT_TRIALS=$${STATEOPS_FAULT_TRIALS:-20} \
	  STATEOPS_FAULT_RESTARTS=$${STATEOPS_FAULT_RESTARTS:-3} \
	  $(PY) -m pytest tests/faults -p no:xdist -q --whole-proof $(PYTEST_ARGS)

clean:
	rm -rf build .airflow .pytest_cache
