# The two commands of the README, and the helpers CI uses.
#   make up    install into .venv and run `shardgate up` on the embedded default (SQLite)
#   make test  install into .venv, configure the local servers, run the whole test suite

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# `make up` needs only the package (SQLite shards); tests, lint and benches need the extras.
BASE := $(VENV)/.installed-base
STAMP := $(VENV)/.installed-dev

.PHONY: up test install install-base servers lint bench-smoke bench doctor clean console-screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(BASE): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --disable-pip-version-check -e .
	touch $(BASE)

$(STAMP): pyproject.toml | $(BIN)/python
	@# mysqlclient builds against libmariadb-dev; the MySQL-listener tests use the mariadb
	@# client and Spark's MariaDB Connector/J (Debian packages, installed once, as root)
	(command -v mariadb_config >/dev/null && command -v mariadb >/dev/null && test -e /usr/share/java/mariadb-java-client.jar) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libmariadb-dev pkg-config mariadb-client libmariadb-java)
	$(BIN)/pip install --disable-pip-version-check -e '.[dev]'
	touch $(STAMP) $(BASE)

install-base: $(BASE)

install: $(STAMP)

up: $(BASE)
	@echo
	@echo "shardgate is installed in $(VENV). In another shell, from this directory:"
	@echo "    . $(VENV)/bin/activate && shardgate sql \"select * from customer\""
	@echo
	$(BIN)/shardgate up

doctor: $(BASE)
	$(BIN)/shardgate doctor

servers:
	bash scripts/install-system-deps.sh
	bash scripts/setup-servers.sh

test: $(STAMP) servers
	@# three workers, each taking whole test files (module-scoped fixtures stay shared); four
	@# took 14 min instead of 21 on 2 cores but failed load-bound tests in 3 of 4 runs
	@# then, alone, the tests that change a server's shared state (marker server_wide)
	@# the 40 slowest tests and the slowest files (tests/conftest.py) close each run's log
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/pytest -n 3 --dist loadfile -m "not server_wide" --durations=40
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/pytest -m server_wide --durations=10

# rewrite docs/console/*.png from the browser tests (ordinary runs leave them alone)
console-screenshots: $(STAMP)
	SHARDGATE_SCREENSHOTS=1 $(BIN)/pytest tests/browser -p no:randomly -q

lint: $(STAMP)
	$(BIN)/ruff check shardgate tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

bench-smoke: $(STAMP) servers
	$(BIN)/python bench/gate_point_select.py --smoke && $(BIN)/python bench/scatter_aggregate.py --smoke
	$(BIN)/python bench/planning.py --smoke && $(BIN)/python bench/result_limits.py --smoke
	$(BIN)/python bench/mysql_point_select.py --smoke
	PYTHON=$(abspath $(BIN)/python) bash bench/sysbench.sh --smoke
	$(BIN)/python bench/gate_hop.py --smoke
	$(BIN)/pip install --quiet -e '.[bench]' && $(BIN)/python bench/queue_e2e.py --smoke
	$(BIN)/python bench/segmented_queue.py --smoke
	$(BIN)/python bench/segmented_served.py --smoke
	$(BIN)/python bench/change_stream.py --smoke
	$(BIN)/python bench/inbox.py --smoke
	$(BIN)/python bench/auth_overhead.py --smoke
	$(BIN)/python bench/topo_propagation.py --smoke
	test -e /usr/share/java/postgresql.jar || (apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java); PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_read.py --smoke
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_stream.py --smoke
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_dump.py --smoke

bench: $(STAMP) servers
	$(BIN)/python bench/gate_point_select.py
	$(BIN)/python bench/scatter_aggregate.py
	$(BIN)/python bench/planning.py
	$(BIN)/python bench/mysql_point_select.py
	PYTHON=$(abspath $(BIN)/python) bash bench/sysbench.sh
	$(BIN)/python bench/gate_hop.py
	$(BIN)/pip install --quiet -e '.[bench]' && $(BIN)/python bench/queue_e2e.py
	$(BIN)/python bench/segmented_queue.py
	$(BIN)/python bench/segmented_served.py
	$(BIN)/python bench/change_stream.py
	$(BIN)/python bench/inbox.py
	$(BIN)/python bench/topo_propagation.py
	test -e /usr/share/java/postgresql.jar || (apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java); PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_read.py
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_stream.py
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_dump.py

clean:
	rm -rf $(VENV) shardgate-data .pytest_cache .mypy_cache .ruff_cache
