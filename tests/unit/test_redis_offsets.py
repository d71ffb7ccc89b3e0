"""The Redis store's record of what this process appended (lost-event detection), bounded."""

from __future__ import annotations

from mcp_sse_gateway.store.redis.offsets import WrittenOffsets


def test_expected_is_the_highest_offset_appended_or_minus_one():
    written = WrittenOffsets()
    assert written.expected("d", "life") == -1
    written.track("d", "life", 0)
    written.track("d", "life", 7)
    written.track("d", "life", 5)  # a concurrent append that completed later
    assert written.expected("d", "life") == 7
    assert written.expected("d", "other") == -1
    assert written.expected("e", "life") == -1


def test_forget_one_life_or_a_whole_session():
    written = WrittenOffsets()
    for life in ("a", "b"):
        written.track("d", life, 1)
    written.track("e", "a", 1)
    written.forget("d", "a")
    assert (written.expected("d", "a"), written.expected("d", "b"), len(written)) == (-1, 1, 2)
    written.forget("d")
    assert (written.expected("d", "b"), len(written)) == (-1, 1)
    written.forget("d")  # nothing left: no error
    written.forget("nobody", "x")
    assert len(written) == 1


def test_the_oldest_sessions_are_forgotten_beyond_the_bound():
    written = WrittenOffsets(limit=3)
    written.track("old", "a", 1)
    written.track("old", "b", 1)
    written.track("mid", "a", 1)
    written.track("new", "a", 1)  # 4 > 3: the oldest session goes, both its lives
    assert len(written) == 2
    assert written.expected("old", "a") == -1
    assert (written.expected("mid", "a"), written.expected("new", "a")) == (1, 1)
