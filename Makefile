# The two commands a newcomer needs (see README.md):
#   make demo   set up, start a local Kafka broker, run traffic through kproxy, capture it,
#               and (on Ctrl-C) analyse the capture with Spark
#   make test   set up and run the test suite
VENV := .venv

.PHONY: setup test demo schema schema-check bench

setup:
	@bash scripts/setup.sh

test: setup
	$(VENV)/bin/python -m pytest

demo: setup
	$(VENV)/bin/python -m kproxy demo --analyze

schema:
	$(VENV)/bin/python tools/generate_schema.py

schema-check:
	$(VENV)/bin/python tools/generate_schema.py --check

bench: setup
	$(VENV)/bin/python benchmarks/bench_codec.py
