-- 026: the per-address sign-in ceiling counts failures, not people (issue 31, item 2).
--
-- An office NAT or a VPN puts sixty on-call engineers behind one address. The 'addr' counter of
-- skiplock.login_throttle used to count every attempt, given back when the password was right:
-- while sixty right passwords were still being checked, each held a place, and the 21st was
-- refused. `pending` counts the attempts of the address whose password is being checked now;
-- `failures` still counts them too (so parallel guesses cannot overshoot the ceiling), and an
-- attempt that finds the ceiling held by pending checks waits for them instead of being refused
-- (console/users.py, `throttle`). A default on a new column is a catalogue change only.
ALTER TABLE skiplock.login_throttle
    ADD COLUMN pending integer NOT NULL DEFAULT 0;
