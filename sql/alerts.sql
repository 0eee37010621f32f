-- Alerts: rules saved in the UI, alert state, events, silences, the outbox and the delivery log.
-- Every read is bounded (by time, by the partial indexes, or by LIMIT).

-- name: ui_rules
SELECT
    r.name,
    r.metric,
    r.labels,
    r.op,
    r.threshold,
    r.clear,
    r.for_seconds,
    r.severity,
    r.summary,
    r.runbook,
    r.webhooks,
    r.guard,
    r.enabled,
    r.updated_by,
    r.updated_at
FROM skiplock.alert_rules AS r
ORDER BY r.name;

-- name: upsert_ui_rule
INSERT INTO skiplock.alert_rules AS r
    (name, metric, labels, op, threshold, clear, for_seconds, severity, summary, runbook, webhooks, guard, enabled, updated_by)
VALUES
    (%(name)s, %(metric)s, %(labels)s, %(op)s, %(threshold)s, %(clear)s, %(for_seconds)s, %(severity)s, %(summary)s,
     %(runbook)s, %(webhooks)s, %(guard)s, %(enabled)s, %(actor)s)
ON CONFLICT (name) DO UPDATE SET
    metric = EXCLUDED.metric,
    labels = EXCLUDED.labels,
    op = EXCLUDED.op,
    threshold = EXCLUDED.threshold,
    clear = EXCLUDED.clear,
    for_seconds = EXCLUDED.for_seconds,
    severity = EXCLUDED.severity,
    summary = EXCLUDED.summary,
    runbook = EXCLUDED.runbook,
    webhooks = EXCLUDED.webhooks,
    guard = EXCLUDED.guard,
    enabled = EXCLUDED.enabled,
    updated_by = EXCLUDED.updated_by,
    updated_at = now();

-- name: delete_ui_rule
DELETE FROM skiplock.alert_rules AS r
WHERE r.name = %(name)s
RETURNING r.name;

-- name: ui_destinations
SELECT
    d.name,
    d.kind,
    d.url,
    d.secret,
    d.headers,
    d.updated_by,
    d.updated_at
FROM skiplock.alert_destinations AS d
ORDER BY d.name;

-- name: upsert_ui_destination
INSERT INTO skiplock.alert_destinations AS d (name, kind, url, secret, headers, updated_by)
VALUES (%(name)s, %(kind)s, %(url)s, %(secret)s, %(headers)s, %(actor)s)
ON CONFLICT (name) DO UPDATE SET
    kind = EXCLUDED.kind,
    url = EXCLUDED.url,
    secret = EXCLUDED.secret,
    headers = EXCLUDED.headers,
    updated_by = EXCLUDED.updated_by,
    updated_at = now();

-- name: delete_ui_destination
DELETE FROM skiplock.alert_destinations AS d
WHERE d.name = %(name)s
RETURNING d.name;

-- name: evaluation_lock
-- One evaluator at a time (the scheduler leader, or a CLI/test run): held to the end of the transaction.
SELECT pg_advisory_xact_lock(%(key)s);

-- name: latest_samples
-- The samples of the newest collection cycle within the window before %(now)s, for the given
-- metrics. A series missing from that cycle is gone (a drained queue the collector no longer
-- lists), which differs from a NULL value (the collector could not measure it). Samples written
-- without collection runs (tests, imports) fall back to each metric's newest timestamp.
WITH run AS (
    SELECT r.started_at
    FROM skiplock.collection_runs AS r
    WHERE r.started_at > %(now)s::timestamptz - make_interval(secs => %(window)s)
      AND r.started_at <= %(now)s::timestamptz
    ORDER BY r.started_at DESC
    LIMIT 1
),
newest AS (
    SELECT
        m.metric,
        coalesce(
            (SELECT run.started_at FROM run),
            (
                SELECT max(x.collected_at)
                FROM skiplock.samples AS x
                WHERE x.metric = m.metric
                  AND x.collected_at > %(now)s::timestamptz - make_interval(secs => %(window)s)
                  AND x.collected_at <= %(now)s::timestamptz
            )
        ) AS collected_at
    FROM unnest(%(metrics)s::text[]) AS m (metric)
)
SELECT
    s.metric,
    s.labels,
    s.value,
    s.collected_at
FROM newest AS n
JOIN skiplock.samples AS s
  ON s.metric = n.metric
 AND s.collected_at = n.collected_at
ORDER BY s.metric, s.labels;

-- name: newest_collection
SELECT
    max(c.finished_at) AS finished_at
FROM (
    SELECT r.finished_at
    FROM skiplock.collection_runs AS r
    ORDER BY r.started_at DESC
    LIMIT 5
) AS c;

-- name: active_alerts
SELECT
    a.id,
    a.rule,
    a.labels,
    a.state,
    a.state_since,
    a.value,
    a.evaluated_at,
    a.fired_at,
    a.resolved_at,
    a.notified,
    a.last_notified_at,
    a.acknowledged_by,
    a.acknowledged_at,
    a.ack_note,
    a.last_over_value
FROM skiplock.alerts AS a
WHERE a.state <> 'ok'
ORDER BY a.id;

-- name: active_alerts_counts
-- How many alerts are firing, pending, and active in all (alerts_active_idx).
SELECT
    count(*) FILTER (WHERE a.state = 'firing') AS firing,
    count(*) FILTER (WHERE a.state = 'pending') AS pending,
    count(*) AS active
FROM skiplock.alerts AS a
WHERE a.state <> 'ok';

-- name: active_alerts_page
-- One page of the active alerts in the alerts list's order: firing first, then by the rank of
-- the rule's severity (%(rules)s and %(ranks)s, two arrays: a rule not in them ranks 3, as a rule
-- the rule set no longer has), the longest in its state first, the id breaking ties (the order
-- active_alerts reads them in). %(offset)s rows skipped, at most %(limit)s.
SELECT
    a.id,
    a.rule,
    a.labels,
    a.state,
    a.state_since,
    a.value,
    a.evaluated_at,
    a.fired_at,
    a.resolved_at,
    a.notified,
    a.last_notified_at,
    a.acknowledged_by,
    a.acknowledged_at,
    a.ack_note,
    a.last_over_value
FROM skiplock.alerts AS a
LEFT JOIN unnest(%(rules)s::text[], %(ranks)s::int[]) AS r (rule, rank) ON r.rule = a.rule
WHERE a.state <> 'ok'
ORDER BY a.state <> 'firing', coalesce(r.rank, 3), a.state_since, a.id
LIMIT %(limit)s OFFSET %(offset)s;

-- name: active_alert_names
-- Every active alert's id, rule and labels in the same order: what a search (`q`) matches.
SELECT
    a.id,
    a.rule,
    a.labels
FROM skiplock.alerts AS a
LEFT JOIN unnest(%(rules)s::text[], %(ranks)s::int[]) AS r (rule, rank) ON r.rule = a.rule
WHERE a.state <> 'ok'
ORDER BY a.state <> 'firing', coalesce(r.rank, 3), a.state_since, a.id;

-- name: active_alerts_by_id
-- The active alerts among %(ids)s (the search's page), in id order.
SELECT
    a.id,
    a.rule,
    a.labels,
    a.state,
    a.state_since,
    a.value,
    a.evaluated_at,
    a.fired_at,
    a.resolved_at,
    a.notified,
    a.last_notified_at,
    a.acknowledged_by,
    a.acknowledged_at,
    a.ack_note,
    a.last_over_value
FROM skiplock.alerts AS a
WHERE a.id = ANY(%(ids)s::bigint[])
  AND a.state <> 'ok'
ORDER BY a.id;

-- name: set_state
-- Moves one (rule, labels) to a state, creating its row the first time. Entering pending or
-- firing starts a new episode: acknowledgement and the notified flag are cleared.
-- %(over)s: the value meets the rule's condition, so it is also the last value over the threshold.
INSERT INTO skiplock.alerts AS a (rule, labels, state, state_since, value, evaluated_at, fired_at, last_over_value)
VALUES (%(rule)s, %(labels)s, %(state)s, %(now)s, %(value)s, %(now)s,
        CASE WHEN %(state)s = 'firing' THEN %(now)s::timestamptz END,
        CASE WHEN %(over)s THEN %(value)s::float8 END)
ON CONFLICT (rule, labels) DO UPDATE SET
    state = EXCLUDED.state,
    state_since = %(now)s,
    value = EXCLUDED.value,
    last_over_value = CASE WHEN %(over)s THEN EXCLUDED.value ELSE a.last_over_value END,
    evaluated_at = %(now)s,
    fired_at = CASE WHEN EXCLUDED.state = 'firing' THEN %(now)s::timestamptz ELSE a.fired_at END,
    resolved_at = CASE WHEN EXCLUDED.state = 'ok' AND a.state = 'firing' THEN %(now)s::timestamptz
                       WHEN EXCLUDED.state = 'ok' THEN a.resolved_at ELSE NULL END,
    notified = CASE WHEN EXCLUDED.state = 'ok' OR a.state = 'ok' THEN false ELSE a.notified END,
    last_notified_at = CASE WHEN a.state = 'ok' THEN NULL ELSE a.last_notified_at END,
    acknowledged_by = CASE WHEN EXCLUDED.state = 'firing' AND a.state = 'firing' THEN a.acknowledged_by END,
    acknowledged_at = CASE WHEN EXCLUDED.state = 'firing' AND a.state = 'firing' THEN a.acknowledged_at END,
    ack_note = CASE WHEN EXCLUDED.state = 'firing' AND a.state = 'firing' THEN a.ack_note END
RETURNING a.id, a.rule, a.labels, a.state, a.state_since, a.value, a.fired_at, a.resolved_at, a.notified,
          a.last_notified_at, a.acknowledged_by, a.acknowledged_at, a.ack_note, a.last_over_value;

-- name: touch_alert
-- %(over)s as in set_state: a firing alert's value between its clear value and the threshold
-- (hysteresis) keeps it firing but is not over the threshold.
UPDATE skiplock.alerts AS a
SET value = %(value)s,
    last_over_value = CASE WHEN %(over)s THEN %(value)s::float8 ELSE a.last_over_value END,
    evaluated_at = %(now)s
WHERE a.id = %(id)s;

-- name: mark_notified
UPDATE skiplock.alerts AS a
SET notified = true,
    last_notified_at = %(now)s
WHERE a.id = %(id)s;

-- name: insert_event
INSERT INTO skiplock.alert_events (alert_id, at, kind, value, actor, detail)
VALUES (%(alert_id)s, %(at)s, %(kind)s, %(value)s, %(actor)s, %(detail)s)
RETURNING id;

-- name: active_silences
SELECT
    s.id,
    s.rule,
    s.labels,
    s.starts_at,
    s.ends_at,
    s.reason,
    s.created_by
FROM skiplock.alert_silences AS s
WHERE s.ends_at > %(now)s
  AND s.starts_at <= %(now)s
ORDER BY s.ends_at DESC, s.id DESC
LIMIT 1000;

-- name: insert_silence
INSERT INTO skiplock.alert_silences (rule, labels, starts_at, ends_at, reason, created_by)
VALUES (%(rule)s, %(labels)s, %(starts_at)s, %(ends_at)s, %(reason)s, %(actor)s)
RETURNING id, rule, labels, starts_at, ends_at, reason, created_by;

-- name: expire_silence
UPDATE skiplock.alert_silences AS s
SET ends_at = greatest(s.starts_at + interval '1 microsecond', now()),
    expired_by = %(actor)s
WHERE s.id = %(id)s
  AND s.ends_at > now()
RETURNING s.id, s.rule, s.labels, s.reason;

-- name: recent_silences
SELECT
    s.id,
    s.rule,
    s.labels,
    s.starts_at,
    s.ends_at,
    s.reason,
    s.created_by,
    s.expired_by,
    s.ends_at > now() AS active
FROM skiplock.alert_silences AS s
WHERE s.ends_at > now() - interval '1 day'
ORDER BY s.ends_at DESC, s.id DESC
LIMIT %(limit)s;

-- name: get_alert
SELECT
    a.id,
    a.rule,
    a.labels,
    a.state,
    a.state_since,
    a.value,
    a.evaluated_at,
    a.fired_at,
    a.resolved_at,
    a.notified,
    a.last_notified_at,
    a.acknowledged_by,
    a.acknowledged_at,
    a.ack_note,
    a.last_over_value
FROM skiplock.alerts AS a
WHERE a.id = %(id)s;

-- name: acknowledge
UPDATE skiplock.alerts AS a
SET acknowledged_by = %(actor)s,
    acknowledged_at = now(),
    ack_note = %(note)s
WHERE a.id = %(id)s
  AND a.state = 'firing'
RETURNING a.id, a.rule, a.labels;

-- name: recent_events
-- The history the alerts page shows: newest first, keyset-paginated on id.
SELECT
    e.id,
    e.at,
    e.kind,
    e.value,
    e.actor,
    e.detail,
    a.id AS alert_id,
    a.rule,
    a.labels
FROM skiplock.alert_events AS e
JOIN skiplock.alerts AS a ON a.id = e.alert_id
WHERE (%(before_id)s::bigint IS NULL OR e.id < %(before_id)s)
  AND (%(alert_id)s::bigint IS NULL OR e.alert_id = %(alert_id)s)
ORDER BY e.id DESC
LIMIT %(limit)s;

-- name: outbox_insert
INSERT INTO skiplock.alert_outbox (event_id, alert_id, destination, idempotency_key, notification, created_at, next_attempt_at)
VALUES (%(event_id)s, %(alert_id)s, %(destination)s, %(idempotency_key)s, %(notification)s, now(), now())
ON CONFLICT (idempotency_key, destination) DO NOTHING
RETURNING id;

-- name: outbox_claim
-- The oldest due notification whose earlier siblings (same alert, same destination) are all
-- settled, so each receiver sees an alert's transitions in order. Marks it held by a lease; the
-- statement commits on its own, so nothing is held across the HTTP call.
UPDATE skiplock.alert_outbox AS o
SET attempts = o.attempts + 1,
    locked_until = now() + make_interval(secs => %(lease)s)
WHERE o.id = (
    SELECT c.id
    FROM skiplock.alert_outbox AS c
    WHERE c.status = 'pending'
      AND c.next_attempt_at <= now()
      AND (c.locked_until IS NULL OR c.locked_until < now())
      AND NOT EXISTS (
          SELECT 1
          FROM skiplock.alert_outbox AS e
          WHERE e.status = 'pending'
            AND e.alert_id IS NOT DISTINCT FROM c.alert_id
            AND e.destination = c.destination
            AND e.id < c.id
      )
    ORDER BY c.next_attempt_at, c.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING o.id, o.event_id, o.alert_id, o.destination, o.idempotency_key, o.notification, o.created_at, o.attempts;

-- name: outbox_settle
-- Records the outcome of one attempt; fenced by the attempt number, so a sender whose lease ran
-- out cannot overwrite the row another sender has since claimed.
UPDATE skiplock.alert_outbox AS o
SET status = %(status)s,
    next_attempt_at = coalesce(%(next_attempt_at)s, o.next_attempt_at),
    locked_until = NULL,
    last_error = %(error)s,
    finished_at = CASE WHEN %(status)s <> 'pending' THEN now() END
WHERE o.id = %(id)s
  AND o.attempts = %(attempt)s
  AND o.status = 'pending'
RETURNING o.id;

-- name: delivery_log_insert
INSERT INTO skiplock.alert_deliveries (outbox_id, destination, attempt, outcome, http_status, error, duration_ms)
VALUES (%(outbox_id)s, %(destination)s, %(attempt)s, %(outcome)s, %(http_status)s, %(error)s, %(duration_ms)s)
RETURNING id;

-- name: delivery_log
-- Newest first, keyset-paginated on id; filter by destination and/or alert.
SELECT
    d.id,
    d.at,
    d.destination,
    d.attempt,
    d.outcome,
    d.http_status,
    d.error,
    d.duration_ms,
    d.outbox_id,
    o.alert_id,
    o.notification ->> 'event' AS event,
    o.notification -> 'alert' ->> 'rule' AS rule,
    o.notification -> 'alert' -> 'labels' AS labels,
    o.status AS outbox_status
FROM skiplock.alert_deliveries AS d
LEFT JOIN skiplock.alert_outbox AS o ON o.id = d.outbox_id
WHERE (%(before_id)s::bigint IS NULL OR d.id < %(before_id)s)
  AND (%(destination)s::text IS NULL OR d.destination = %(destination)s)
  AND (%(alert_id)s::bigint IS NULL OR o.alert_id = %(alert_id)s)
ORDER BY d.id DESC
LIMIT %(limit)s;

-- name: outbox_pending_summary
-- What waits for each destination, and why: the newest error among its retrying notifications
-- (NULL while none has failed yet), so a count of waiting notifications comes with its reason.
SELECT
    o.destination,
    count(*) AS pending,
    min(o.created_at) AS oldest,
    max(o.attempts) AS most_attempts,
    count(o.last_error) AS retrying,
    (array_agg(o.last_error ORDER BY o.id DESC) FILTER (WHERE o.last_error IS NOT NULL))[1] AS last_error
FROM skiplock.alert_outbox AS o
WHERE o.status = 'pending'
GROUP BY o.destination
ORDER BY o.destination;

-- name: outbox_recent
SELECT
    o.id,
    o.alert_id,
    o.destination,
    o.idempotency_key,
    o.notification ->> 'event' AS event,
    o.status,
    o.attempts,
    o.created_at,
    o.next_attempt_at,
    o.last_error,
    o.finished_at
FROM skiplock.alert_outbox AS o
WHERE (%(alert_id)s::bigint IS NULL OR o.alert_id = %(alert_id)s)
ORDER BY o.created_at DESC, o.id DESC
LIMIT %(limit)s;

-- name: prune_deliveries
-- Retention, one bounded batch: delivery-log rows older than the cutoff.
DELETE FROM skiplock.alert_deliveries AS d
WHERE d.id IN (
    SELECT x.id
    FROM skiplock.alert_deliveries AS x
    WHERE x.at < %(cutoff)s
    ORDER BY x.at
    LIMIT %(batch)s
);

-- name: prune_events
-- Retention, one bounded batch: alert history older than the cutoff, except events of alerts
-- that are not ok now (a live alert keeps its story) and events a notification still points to
-- (the outbox is pruned on its own schedule; migration 013 indexes alert_outbox.event_id).
DELETE FROM skiplock.alert_events AS e
WHERE e.id IN (
    SELECT x.id
    FROM skiplock.alert_events AS x
    JOIN skiplock.alerts AS a ON a.id = x.alert_id
    WHERE x.at < %(cutoff)s
      AND a.state = 'ok'
      AND NOT EXISTS (SELECT 1 FROM skiplock.alert_outbox AS o WHERE o.event_id = x.id)
    ORDER BY x.at
    LIMIT %(batch)s
);

-- name: prune_outbox
-- Retention, one bounded batch: settled notifications older than the cutoff (their few
-- delivery rows go with them).
DELETE FROM skiplock.alert_outbox AS o
WHERE o.id IN (
    SELECT x.id
    FROM skiplock.alert_outbox AS x
    WHERE x.status <> 'pending'
      AND x.finished_at < %(cutoff)s
    ORDER BY x.finished_at
    LIMIT %(batch)s
);

-- name: alert_series
-- One alert's series for its page: the samples of one metric whose labels include the alert's,
-- between two times (samples_metric_time_idx), in buckets of %(step)s, each bucket's max (or
-- min for a `<` rule) so a threshold crossing shows.
SELECT
    date_bin(%(step)s::interval, s.collected_at, %(since)s) AS at,
    CASE WHEN %(agg)s::text = 'min' THEN min(s.value) ELSE max(s.value) END AS value
FROM skiplock.samples AS s
WHERE s.metric = %(metric)s
  AND s.collected_at >= %(since)s
  AND s.collected_at <= %(until)s
  AND s.labels @> %(labels)s::jsonb
GROUP BY 1
ORDER BY 1;

-- name: caps_silences
-- caps.silences: silences still in force.
SELECT count(*) AS held
FROM skiplock.alert_silences AS s
WHERE s.ends_at > now();

-- name: caps_ui_rules
-- caps.alert_rules: rules saved from the console, and whether this name is one (an update).
SELECT count(*) AS held,
       bool_or(r.name = %(name)s) AS exists
FROM skiplock.alert_rules AS r;

-- name: caps_ui_destinations
-- caps.destinations: destinations saved from the console, and whether this name is one.
SELECT count(*) AS held,
       bool_or(d.name = %(name)s) AS exists
FROM skiplock.alert_destinations AS d;
