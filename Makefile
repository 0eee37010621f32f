# Developer tasks. `make demo` and `make test` set up what they need on a fresh machine.
.PHONY: demo test test-matrix lint bench setup

# The PostgreSQL matrix: the full suite runs on the machine's PostgreSQL (15), then the files
# whose SQL depends on the server (the queue protocol's statements, migrations, the collectors'
# and the advisor's reads of pg_stat_* views, and the version checks) run again on each of these
# majors, whose binaries scripts/bootstrap.sh --test fetches (tests/conftest.py --postgresql).
# The majors run at once, each in one process (-n 0): their tests mostly wait (on sleeps,
# locks and the server), so three at once take about as long as one (about 70 s in all,
# where one after the other with two xdist workers each took about 45 s a major). The worker,
# archive and CLI maintenance files ran here too until CI neared its 20 minutes: they add a minute a major, and their statements (batched DELETE ... RETURNING,
# INSERT ... SELECT, the claim test_queue.py runs) use nothing a major changed.
PG_MATRIX = 16 17 18
PG_MATRIX_FILES = tests/test_migrate.py tests/test_queue.py \
	tests/test_collectors_*.py tests/test_advisor*.py tests/test_postgresql_versions.py

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
	@logs=$$(mktemp -d); \
	for major in $(PG_MATRIX); do \
	  ( .venv/bin/python -m pytest -n 0 --postgresql $$major $(PG_MATRIX_FILES) > $$logs/$$major.log 2>&1; \
	    echo $$? > $$logs/$$major.rc ) & \
	done; \
	wait; status=0; \
	for major in $(PG_MATRIX); do \
	  echo "== the PostgreSQL matrix on PostgreSQL $$major: $(PG_MATRIX_FILES)"; \
	  cat $$logs/$$major.log; \
	  rc=$$(cat $$logs/$$major.rc); [ "$$rc" -eq 0 ] || status=$$rc; \
	done; \
	rm -rf $$logs; exit $$status

lint:
	.venv/bin/ruff check .

# The headline comparison (skiplock, PGQueuer on both its drivers, bare loop; 1/2/4/16 workers;
# 3 rounds) in about 7 minutes; `make bench ARGS="..."` runs bench/throughput.py with other arguments instead.
bench:
	scripts/bootstrap.sh
	.venv/bin/python -m pip install -q -e '.[bench]'
	.venv/bin/python bench/throughput.py $(or $(ARGS),--headline)
