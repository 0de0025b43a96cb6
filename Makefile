# The two commands of the README: `make demo` (set up + run the main job) and
# `make test` (set up + pass the tests). Both are safe to run again.
.PHONY: setup demo test test-faults test-cluster bench lint

setup:
	bash deploy/setup.sh

demo: setup
	.venv/bin/aldebaran demo

# Four pytest workers: most tests wait on RabbitMQ, Redis and private brokers, not on CPU;
# the Spark tests share two of them, one JVM each (tests/conftest.py). On 2026-11-28's slow
# host three took 650-654 s (over ten minutes) and four 595-627 s in four runs, every test
# passing (docs/reliability.md, "Runtime"); once before, a more loaded box broke a timing margin.
test:
	SETUP_TEST_TOOLS=1 bash deploy/setup.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -n 4 --dist loadgroup --durations=15

# The three-node cluster test alone (it is part of `make test` too).
test-cluster: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m cluster

test-faults: setup
	.venv/bin/python -m pytest -q -m faults

bench: setup
	.venv/bin/pip install -q -e '.[bench]'
	.venv/bin/aldebaran bench

# Static checks: ruff (the packages, the tests and deploy's scripts), mypy (the packages) and the import-linter
# layer contracts (pyproject.toml).
# Needs only the virtualenv (no RabbitMQ or Redis): setup stops after creating it.
PACKAGES = aldebaran declare workers spark_analytics
lint:
	SETUP_VENV_ONLY=1 bash deploy/setup.sh
	.venv/bin/ruff check $(PACKAGES) tests deploy
	.venv/bin/mypy $(PACKAGES)
	.venv/bin/lint-imports
