-- 011: a bulk replay or purge is bound to what its preview showed. The preview's highest
-- matching job id bounds the operation (the runner never touches a job with a higher id,
-- even when resumed days later), and the previewed count and time are kept beside the count
-- the start found, so the operation page and the audit log can show what was confirmed.
-- Operations created before this migration have no bound (NULL): they run as before.

ALTER TABLE skiplock.bulk_operations
    ADD COLUMN max_id          bigint,
    ADD COLUMN previewed_at    timestamptz,
    ADD COLUMN previewed_total bigint;
