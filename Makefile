# Developer tasks. `make demo` and `make test` set up what they need on a fresh machine.
.PHONY: demo test lint bench setup

setup:
	scripts/bootstrap.sh --test

demo:
	scripts/bootstrap.sh
	.venv/bin/skiplock demo $(ARGS)

test:
	scripts/bootstrap.sh --test
	.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder $(ARGS)

lint:
	.venv/bin/ruff check .

# The headline comparison (skiplock, PGQueuer on both its drivers, bare loop; 1/2/4/16 workers;
# 3 rounds) in about 7 minutes; `make bench ARGS="..."` runs bench/throughput.py with other arguments instead.
bench:
	scripts/bootstrap.sh
	.venv/bin/python -m pip install -q -e '.[bench]'
	.venv/bin/python bench/throughput.py $(or $(ARGS),--headline)
