"""`python -m skiplock ...` is the `skiplock` command (worker, migrate, enqueue, ...)."""

from console.cli import run

run()
