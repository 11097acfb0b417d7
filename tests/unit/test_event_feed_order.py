"""A stream's place only moves forward (docs/design.md §19 route 14, issue 24): a read that comes
back out of (tx, id) order loses the rows behind the place — counted — and never re-sends one.

Before, the feed appended whatever a read returned; a page out of order left the shared buffer
unsorted, the streams' places jumped back and forth, and frames were re-sent tens of thousands of
times. The reads' order is fixed in SQL (tests/db/test_event_order.py); this is the bound that
keeps an ordering bug from becoming a storm.
"""

from __future__ import annotations

from typing import Any

from mediator.api.events import EventFeed


def feed_counting() -> tuple[EventFeed, list[int]]:
    dropped: list[int] = []
    feed = EventFeed(med=None)  # type: ignore[arg-type]  # _forward touches no database
    feed.on_out_of_order = dropped.append
    return feed, dropped


def rows(*places: tuple[int, int]) -> list[tuple[tuple[int, int], bytes]]:
    return [(p, f"id: {p[1]}\n\n".encode()) for p in places]


def test_rows_in_order_pass_untouched_and_count_nothing() -> None:
    feed, dropped = feed_counting()
    page = rows((9998, 1), (9999, 2), (10000, 3), (10001, 4))
    assert feed._forward(page, (0, 0)) == page
    assert dropped == []


def test_a_text_ordered_page_loses_what_lies_behind_the_place_and_counts_it() -> None:
    # The old query's page: '10000' < '9999' as text. 9998 and 9999 come after 10001.
    feed, dropped = feed_counting()
    page = rows((10000, 3), (10001, 4), (9998, 1), (9999, 2))
    assert [p for p, _ in feed._forward(page, (0, 0))] == [(10000, 3), (10001, 4)]
    assert dropped == [2]


def test_nothing_at_or_before_the_place_is_sent_again() -> None:
    feed, dropped = feed_counting()
    place = (10001, 4)
    page = rows((9999, 2), (10001, 4), (10002, 5))
    assert [p for p, _ in feed._forward(page, place)] == [(10002, 5)]
    assert dropped == [2]


def test_a_place_is_sent_once_however_often_a_read_repeats_it() -> None:
    # A stream reading the same unsorted page again and again (the storm) sends each place once.
    feed, _ = feed_counting()
    page = rows((10000, 3), (9998, 1), (10001, 4), (9999, 2))
    sent: list[Any] = []
    last = (0, 0)
    for _ in range(100):
        out = feed._forward(page, last)
        sent += [p for p, _ in out]
        if out:
            last = out[-1][0]
    assert sent == [(10000, 3), (10001, 4)]
