# The two commands of the README: `make demo` (set up + run the main job) and
# `make test` (set up + pass the tests). Both are safe to run again.
.PHONY: setup demo test test-faults test-cluster bench lint

setup:
	bash deploy/setup.sh

demo: setup
	.venv/bin/aldebaran demo

# Three pytest workers: most tests wait on RabbitMQ, Redis and private brokers, not on CPU;
# the Spark tests share two of them, one JVM each (tests/conftest.py). Four were 578-608 s
# against three's 614 s on a slowed host, and the more loaded box broke a timing margin once.
test:
	SETUP_TEST_TOOLS=1 bash deploy/setup.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 3 --dist loadgroup --durations=15

# The three-node cluster test alone (it is part of `make test` too).
test-cluster: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m cluster

test-faults: setup
	.venv/bin/python -m pytest -q -m faults

bench: setup
	.venv/bin/pip install -q -e '.[bench]'
	.venv/bin/aldebaran bench

# Static checks: ruff, mypy and the import-linter layer contracts (pyproject.toml).
# Needs only the virtualenv (no RabbitMQ or Redis): setup stops after creating it.
PACKAGES = aldebaran declare workers spark_analytics
lint:
	SETUP_VENV_ONLY=1 bash deploy/setup.sh
	.venv/bin/ruff check $(PACKAGES)
	.venv/bin/mypy $(PACKAGES)
	.venv/bin/lint-imports
