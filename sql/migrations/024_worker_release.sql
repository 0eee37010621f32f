-- 024: what each worker runs (issue 33, "what changed": deploys on the incident timeline).
--
-- version: Skiplock's own version in the worker process (the installed package's metadata,
--   what `skiplock --version` says, e.g. '0.2.0'; 'unknown' for a checkout run uninstalled).
-- release: the application's release, from `[worker] release` (a deploy sets
--   $SKIPLOCK_WORKER_RELEASE, e.g. a git sha or a build tag); NULL when it is not set.
--
-- Both are written by the worker when it registers (and again at every reconnect). NULL in
-- version means not reported: a worker of an earlier release (0.1.0 names its columns and never
-- writes them) or one in another language. The timeline's deploy events compare only rows that
-- reported (console/timeline.py); the Workers page shows a dash.
--
-- Nullable columns without a default: adding them rewrites nothing, and an older worker keeps
-- registering.
ALTER TABLE skiplock.workers
    ADD COLUMN version text,
    ADD COLUMN release text;
