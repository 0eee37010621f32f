# Developer tasks. `make demo` and `make test` set up what they need on a fresh machine.
.PHONY: demo test test-matrix lint bench setup

# The PostgreSQL matrix: the full suite runs on the machine's PostgreSQL (15), then the files
# whose SQL depends on the server run again on each of these majors, whose binaries
# scripts/bootstrap.sh --test fetches (tests/conftest.py --postgresql): the queue protocol's
# statements and migrations (and the enqueue's routing of broker queues' jobs to the outbox,
# tests/test_nats_outbox.py), the worker, the archive and the maintenance CLI (batched DELETE ...
# RETURNING, INSERT ... SELECT, partitions), the collectors' and the advisor's reads of pg_stat_*
# views, and the version checks (tests/test_postgresql_versions.py plans every named query of
# sql/). Each major runs as two processes (-n 0), one per half below (balanced by their times),
# all six at once. Left out to keep CI under 20 minutes: tests/test_advisor_cli.py (the advisor's
# text and exit codes; its reads are test_advisor's).
PG_MATRIX = 16 17 18
PG_MATRIX_QUEUE = tests/test_migrate.py tests/test_queue.py tests/test_worker.py tests/test_nats_outbox.py
PG_MATRIX_READS = tests/test_archive.py tests/test_cli_maintenance.py tests/test_collectors_*.py tests/test_advisor.py \
	tests/test_advisor_causes.py tests/test_advisor_verdict.py tests/test_postgresql_versions.py

setup:
	scripts/bootstrap.sh --test

demo:
	scripts/bootstrap.sh
	.venv/bin/skiplock demo $(ARGS)

# `make test ARGS=tests/test_x.py` runs what ARGS names on 15 only.
test:
	scripts/bootstrap.sh --test
	.venv/bin/python -m pytest -n 3 --dist loadfile --no-loadscope-reorder --max-worker-restart 0 --durations=30 $(ARGS)
	$(if $(ARGS),,$(MAKE) --no-print-directory test-matrix)

test-matrix:
	@logs=$$(mktemp -d); \
	for major in $(PG_MATRIX); do \
	  for half in queue reads; do \
	    if [ $$half = queue ]; then files="$(PG_MATRIX_QUEUE)"; else files="$(PG_MATRIX_READS)"; fi; \
	    ( .venv/bin/python -m pytest -n 0 --postgresql $$major $$files > $$logs/$$major-$$half.log 2>&1; \
	      echo $$? > $$logs/$$major-$$half.rc ) & \
	  done; \
	done; \
	wait; status=0; \
	for major in $(PG_MATRIX); do \
	  for half in queue reads; do \
	    if [ $$half = queue ]; then files="$(PG_MATRIX_QUEUE)"; else files="$(PG_MATRIX_READS)"; fi; \
	    echo "== the PostgreSQL matrix on PostgreSQL $$major: $$files"; \
	    cat $$logs/$$major-$$half.log; \
	    rc=$$(cat $$logs/$$major-$$half.rc); [ "$$rc" -eq 0 ] || status=$$rc; \
	  done; \
	done; \
	rm -rf $$logs; exit $$status

lint:
	.venv/bin/ruff check .

# The headline comparison (skiplock, PGQueuer on asyncpg, the bare loop at 100 jobs a claim, fused and completing apart;
# 1/2/4/16 workers; 3 rounds) in about 8 minutes; `make bench ARGS="..."` runs bench/throughput.py with other arguments instead.
bench:
	scripts/bootstrap.sh
	.venv/bin/python -m pip install -q -e '.[bench]'
	.venv/bin/python bench/throughput.py $(or $(ARGS),--headline)
