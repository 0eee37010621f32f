-- Alert history retention (alerts.events_retention): deleting an alert_events row checks the
-- outbox's foreign key, and the pruning query skips events a notification still points to;
-- both look up alert_outbox by event_id, which had no index.
CREATE INDEX IF NOT EXISTS alert_outbox_event_idx ON skiplock.alert_outbox (event_id);
