"""`skiplock demo`: a private PostgreSQL, workers, realistic traffic and the console, in one command.

- `orchestrator`: starts and stops everything (cluster, migrations, child processes, the demo login).
- `traffic`: the traffic generator process (`python -m console.demo.traffic`).
- `tasks`: the demo's job handlers (`skiplock worker --tasks console.demo.tasks`).
- `seed`: `--seed-history`, a few hours of plausible samples so charts are not empty.

Nothing here is imported by the rest of Skiplock: delete this package and the product still runs.
"""
