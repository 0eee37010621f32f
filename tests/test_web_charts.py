"""The SVG charts: axes, UTC time labels, units, gaps, threshold, the empty state."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

from console.web.charts import (
    Line,
    format_value,
    last_value,
    legend,
    line_chart,
    nice_ceiling,
    points_from_rows,
    series_class,
    summary,
    time_ticks,
)

T0 = datetime(2026, 11, 30, 2, 0, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def parse(markup) -> ET.Element:
    return ET.fromstring(str(markup))


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_empty_chart_says_no_data_yet_and_is_valid_svg():
    root = parse(line_chart([], unit="jobs", start=T0, end=T0 + timedelta(hours=1), title="Depth"))
    assert texts(root) == ["No data yet"]
    assert root.find(f"{SVG}title").text == "Depth"
    # all-None points are "no data" too, not a flat zero line
    root = parse(line_chart([Line("a", [(T0, None)])], unit="jobs", start=T0, end=T0 + timedelta(hours=1)))
    assert texts(root) == ["No data yet"]


def test_line_with_axes_utc_labels_and_unit():
    pts = [(T0 + timedelta(minutes=10 * i), float(v)) for i, v in enumerate([5, 40, 80, 20, 0, 10, 60])]
    root = parse(line_chart([Line("all", pts)], unit="jobs", start=T0, end=T0 + timedelta(hours=1), title="Depth"))
    labels = texts(root)
    assert "0 jobs" in labels and "100 jobs" in labels  # y axis from 0 to a round top above 80
    assert {"02:00", "02:30", "03:00"} <= set(labels)  # UTC ticks at round minutes
    polyline = root.find(f"{SVG}polyline")
    points = [tuple(map(float, p.split(","))) for p in polyline.get("points").split()]
    assert len(points) == 7
    xs = [x for x, _ in points]
    assert xs == sorted(xs)
    # the largest value is the highest point (smallest y), zero sits on the bottom line
    ys = [y for _, y in points]
    assert ys.index(min(ys)) == 2 and ys.index(max(ys)) == 4
    assert root.find(f"{SVG}polygon") is not None  # area under a single line


def test_times_are_labelled_in_utc_even_for_other_zones():
    from datetime import timezone

    plus2 = timezone(timedelta(hours=2))
    start = datetime(2026, 11, 30, 4, 0, tzinfo=plus2)  # 02:00 UTC
    root = parse(line_chart([Line("a", [(start, 1.0), (start + timedelta(hours=1), 2.0)])], unit="jobs",
                            start=start, end=start + timedelta(hours=1)))
    assert "02:00" in texts(root) and "04:00" not in texts(root)


def test_none_is_a_gap_not_a_zero():
    pts = [(T0, 10.0), (T0 + timedelta(minutes=1), 12.0), (T0 + timedelta(minutes=2), None),
           (T0 + timedelta(minutes=3), 11.0), (T0 + timedelta(minutes=4), 9.0)]
    root = parse(line_chart([Line("a", pts)], unit="jobs", start=T0, end=T0 + timedelta(minutes=5)))
    assert len(root.findall(f"{SVG}polyline")) == 2


def test_threshold_line_is_drawn_and_raises_the_axis():
    pts = [(T0, 1.0), (T0 + timedelta(minutes=30), 3.0)]
    root = parse(line_chart([Line("a", pts)], unit="seconds", start=T0, end=T0 + timedelta(hours=1),
                            threshold=300, threshold_label="alert at"))
    lines = [ln for ln in root.iter(f"{SVG}line") if ln.get("class") == "threshold"]
    assert len(lines) == 1
    assert any(t.startswith("alert at 5 min") for t in texts(root))
    assert "5 min" in texts(root)  # axis top is the threshold, not 3 s


def test_several_lines_get_distinct_classes_and_a_legend():
    a = Line("mail", [(T0, 1.0), (T0 + timedelta(minutes=5), 2.0)])
    b = Line("billing", [(T0, 3.0), (T0 + timedelta(minutes=5), 1.0)])
    root = parse(line_chart([a, b], unit="jobs", start=T0, end=T0 + timedelta(minutes=10)))
    classes = [p.get("class") for p in root.findall(f"{SVG}polyline")]
    assert classes == [f"line {series_class('mail')}", f"line {series_class('billing')}"]
    assert classes[0] != classes[1]
    assert root.find(f"{SVG}polygon") is None  # no area fill when lines overlap
    assert "mail" in legend([a, b]) and "billing" in legend([a, b])
    assert str(legend([a])) == ""


def test_a_queue_keeps_its_colour_when_another_queue_appears():
    """Issue 33: the colour was the line's place in the sorted list, so a new queue "archive"
    recoloured every queue after it. It is a function of the queue's name alone."""
    def colour_of(name: str, lines: list[Line]) -> str:
        root = parse(line_chart(lines, unit="jobs", start=T0, end=T0 + timedelta(minutes=10)))
        [found] = [p.get("class") for p in root.findall(f"{SVG}polyline") if p.find(f"{SVG}title").text == name]
        return found

    pts = [(T0, 1.0), (T0 + timedelta(minutes=5), 2.0)]
    before = {n: colour_of(n, [Line("billing", pts), Line("mail", pts)]) for n in ("billing", "mail")}
    after = {n: colour_of(n, [Line("archive", pts), Line("billing", pts), Line("mail", pts)]) for n in ("billing", "mail")}
    assert before == after
    key = re.search(r'<i class="key ([^"]+)"></i>mail', str(legend([Line("archive", pts), Line("mail", pts)]))).group(1)
    assert f"line {key}" == after["mail"]  # the legend's key is the line's colour
    assert series_class("all", alone=True) == "s0 d0"  # an unsplit chart keeps the accent colour


def test_labels_are_escaped():
    root = parse(line_chart([Line("<x>", [(T0, 1.0), (T0 + timedelta(minutes=1), 2.0)])], unit="jobs",
                            start=T0, end=T0 + timedelta(minutes=2), title='a "quoted" <title>'))
    assert root.find(f"{SVG}title").text == 'a "quoted" <title>'


def test_seven_day_window_labels_days():
    ticks = time_ticks(T0, T0 + timedelta(days=7))
    assert 1 <= len(ticks) <= 7
    root = parse(line_chart([Line("a", [(T0, 1.0), (T0 + timedelta(days=6), 2.0)])], unit="jobs",
                            start=T0, end=T0 + timedelta(days=7)))
    assert any(re.fullmatch(r"[A-Z][a-z]{2} \d\d", t) for t in texts(root)), texts(root)


def test_format_value_units():
    assert format_value(1234, "jobs") == "1,234 jobs"
    assert format_value(185, "seconds") == "3 min 5 s"
    assert format_value(0.0042, "seconds") == "4 ms"
    assert format_value(12 * 1024 * 1024, "bytes") == "12.0 MiB"
    assert format_value(2048, "bytes/s") == "2.0 KiB/s"
    assert format_value(0.253, "ratio") == "25.3 %"
    assert format_value(3.14159, "jobs/s") == "3.1 jobs/s"
    assert format_value(2_500_000, "rows") == "2.5 M rows"
    assert format_value(None, "jobs") == "—"


def test_nice_ceiling():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 7, 80, 101, 2400)] == [1, 0.5, 1, 10, 100, 200, 2500]


def test_rows_become_lines_summed_or_split():
    rows = [
        {"at": T0, "labels": {"queue": "mail", "state": "eligible"}, "value": 5},
        {"at": T0, "labels": {"queue": "billing", "state": "eligible"}, "value": 7},
        {"at": T0, "labels": {"queue": "mail", "state": "running"}, "value": 100},
        {"at": T0 + timedelta(minutes=1), "labels": {"queue": "mail", "state": "eligible"}, "value": None},
        {"at": T0 + timedelta(minutes=1), "labels": {"queue": "billing", "state": "eligible"}, "value": 1},
    ]
    total = points_from_rows(rows, where={"state": "eligible"})
    assert [ln.points for ln in total] == [[(T0, 12.0), (T0 + timedelta(minutes=1), 1.0)]]
    split = points_from_rows(rows, where={"state": "eligible"}, split_by="queue")
    assert [ln.label for ln in split] == ["billing", "mail"]
    assert split[1].points == [(T0, 5.0), (T0 + timedelta(minutes=1), None)]
    assert last_value(split) == 6.0  # billing's 1 + mail's last measured 5
    assert summary(split, "jobs") == {"min": "1 jobs", "max": "7 jobs", "last": "6 jobs"}
    assert summary([], "jobs") is None
