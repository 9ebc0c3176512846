# The two commands a newcomer needs (see README.md):
#   make demo   set up, start a local Kafka broker, run traffic through kproxy, capture it,
#               and (on Ctrl-C) analyse the capture with Spark
#   make test   set up and run the test suite
# Both install the versions pinned in constraints.txt. Supply chain:
#   make constraints   re-resolve constraints.txt from pyproject.toml (ARGS=--upgrade: newest)
#   make audit         known vulnerabilities in those pins (exit 2: no advisory database reachable)
VENV := .venv

.PHONY: setup setup-demo test demo schema schema-check helm-files bench constraints audit

# Root (apt-get) is asked only for what is missing: the demo needs Java (and Maven until
# Kafka's jars are cached); the tests add Prometheus, tshark, Chromium and openssl.
setup:
	@bash scripts/setup.sh test

setup-demo:
	@bash scripts/setup.sh demo

test: setup
	$(VENV)/bin/python -m pytest

demo: setup-demo
	$(VENV)/bin/python -m kproxy demo --analyze

schema:
	$(VENV)/bin/python tools/generate_schema.py

schema-check:
	$(VENV)/bin/python tools/generate_schema.py --check

helm-files:
	python3 tools/sync_helm_files.py

bench: setup
	$(VENV)/bin/python benchmarks/bench_codec.py

constraints:
	@bash scripts/constraints.sh $(ARGS)

audit:
	@bash scripts/audit.sh
