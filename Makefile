# Developer tasks. `make demo` and `make test` set up what they need on a fresh machine.
.PHONY: demo test test-matrix lint bench setup

# The PostgreSQL matrix: the full suite runs on the machine's PostgreSQL (15), then the files
# whose SQL and protocol depend on the server (queue, worker, migrations, collectors, advisor,
# maintenance, and the version checks) run again on each of these majors, whose binaries
# scripts/bootstrap.sh --test fetches (tests/conftest.py --postgresql). About 1.5 minutes a major.
PG_MATRIX = 16 17 18
PG_MATRIX_FILES = tests/test_migrate.py tests/test_queue.py tests/test_worker.py \
	tests/test_collectors_*.py tests/test_advisor*.py tests/test_archive.py \
	tests/test_cli_maintenance.py tests/test_postgresql_versions.py

setup:
	scripts/bootstrap.sh --test

demo:
	scripts/bootstrap.sh
	.venv/bin/skiplock demo $(ARGS)

# `make test ARGS=tests/test_x.py` runs what ARGS names on 15 only.
test:
	scripts/bootstrap.sh --test
	.venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --durations=30 $(ARGS)
	$(if $(ARGS),,$(MAKE) --no-print-directory test-matrix)

test-matrix:
	@for major in $(PG_MATRIX); do \
	  echo "== the PostgreSQL matrix on PostgreSQL $$major: $(PG_MATRIX_FILES)"; \
	  .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --postgresql $$major \
	    $(PG_MATRIX_FILES) || exit $$?; \
	done

lint:
	.venv/bin/ruff check .

# The headline comparison (skiplock, PGQueuer on both its drivers, bare loop; 1/2/4/16 workers;
# 3 rounds) in about 7 minutes; `make bench ARGS="..."` runs bench/throughput.py with other arguments instead.
bench:
	scripts/bootstrap.sh
	.venv/bin/python -m pip install -q -e '.[bench]'
	.venv/bin/python bench/throughput.py $(or $(ARGS),--headline)
