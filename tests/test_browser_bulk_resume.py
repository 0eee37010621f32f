"""Resume a cancelled bulk replay from its page in real Chromium (issue 17): the operator gives
a reason and presses Resume, watches the progress end, and the end state is checked in the
database: the previewed jobs replayed, a later failure above the preview's bound untouched,
the resume in the audit log."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from console import audit
from console import maintenance as m
from tests.oncall_data import make_dead_letters
from tests.test_browser_oncall import sign_in, statuses
from tests.test_web_deadletters import one_more_dead_letter

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_resume_a_cancelled_replay_from_its_page(page: Page, live_server, conn, personas):
    dead = make_dead_letters(conn, smtp=6, card=3)
    previewed = m.preview(conn, m.Selection(queue="mail"), sample=3).bound()
    op_id = m.start(conn, "replay", m.Selection(queue="mail"), actor="operator", reason="SMTP fixed", preview=previewed)
    m.cancel(conn, op_id, actor="operator")  # nobody runs it: closed at once, nothing done
    late = one_more_dead_letter(conn)  # not previewed: a resume must leave it alone
    # as if its transaction had committed late: failed before the preview's time, id above its bound
    conn.execute("UPDATE skiplock.jobs SET finished_at = finished_at - interval '1 hour' WHERE id = %s", (late,))

    page.set_default_timeout(15_000)
    sign_in(page, live_server, "operator")
    page.goto(f"{live_server}/deadletters/operations/{op_id}")
    section = page.locator("section[data-state]")
    expect(section).to_have_attribute("data-state", "cancelled")
    page.fill("form.resume textarea[name=reason]", "SMTP really fixed (INC-7)")
    page.locator("form.resume button[data-resume]").click()
    expect(page.locator("section[data-state]")).to_have_attribute("data-state", "done", timeout=20_000)
    expect(page.locator("section[data-state]")).to_contain_text("they are pending again")
    expect(page.locator("form.resume")).to_have_count(0)

    assert statuses(conn, dead["smtp"]) == {i: "pending" for i in dead["smtp"]}
    assert statuses(conn, [late, *dead["card"]]) == {i: "failed" for i in [late, *dead["card"]]}
    [row] = audit.search(conn, action="resume_operation")
    assert (row["actor"], row["reason"]) == ("operator", "SMTP really fixed (INC-7)")
