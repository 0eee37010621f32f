"""The same no-op handler, marked inline (runs on the worker's claim thread): contender skiplock-inline."""

import console


@console.task("noop", inline=True)
def noop(job):
    return None
