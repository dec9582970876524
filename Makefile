# The two commands of the README, and the helpers CI uses.
#   make up    install into .venv and run `shardgate up` on the embedded default (SQLite)
#   make test  install into .venv, configure the local servers, run the whole test suite

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: up test install servers lint bench-smoke bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

up: $(STAMP)
	$(BIN)/shardgate up

servers:
	bash scripts/setup-servers.sh

test: $(STAMP) servers
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check shardgate tests bench
	$(BIN)/mypy

bench-smoke: $(STAMP) servers
	$(BIN)/python bench/gate_point_select.py --smoke && $(BIN)/python bench/scatter_aggregate.py --smoke
	$(BIN)/python bench/planning.py --smoke
	$(BIN)/pip install --quiet -e '.[bench]' && $(BIN)/python bench/queue_e2e.py --smoke
	$(BIN)/python bench/segmented_queue.py --smoke
	$(BIN)/python bench/segmented_served.py --smoke
	$(BIN)/python bench/change_stream.py --smoke
	$(BIN)/python bench/inbox.py --smoke
	test -e /usr/share/java/postgresql.jar || (apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java); PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_read.py --smoke
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_stream.py --smoke
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_dump.py --smoke

bench: $(STAMP) servers
	$(BIN)/python bench/gate_point_select.py
	$(BIN)/python bench/scatter_aggregate.py
	$(BIN)/python bench/planning.py
	$(BIN)/pip install --quiet -e '.[bench]' && $(BIN)/python bench/queue_e2e.py
	$(BIN)/python bench/segmented_queue.py
	$(BIN)/python bench/segmented_served.py
	$(BIN)/python bench/change_stream.py
	$(BIN)/python bench/inbox.py
	test -e /usr/share/java/postgresql.jar || (apt-get update -qq && apt-get install -y -qq libpostgresql-jdbc-java); PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_read.py
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_stream.py
	PYSPARK_PYTHON=$(abspath $(BIN)/python) $(BIN)/python bench/spark_dump.py

clean:
	rm -rf $(VENV) shardgate-data .pytest_cache .mypy_cache .ruff_cache
