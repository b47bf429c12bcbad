"""Deliberately broken processors, for tests that must see their faults named."""

from __future__ import annotations

import pandas as pd

from stateops.pipelines.page_visits import PageVisitsProcessor
from stateops.pipelines.user_sessions import _OUTPUT_COLUMNS, UserSessionsProcessor, _session_row


class ForgetfulUserSessions(UserSessionsProcessor):
    """Emits timed-out sessions but forgets to clear them."""

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        (user_id,) = key
        open_events = [(d, t) for d, t in self.events.get()]
        if open_events:  # the bug: no self.events.clear()
            yield pd.DataFrame(
                [_session_row(user_id, open_events, "timeout")], columns=_OUTPUT_COLUMNS
            )


class CountAsText(PageVisitsProcessor):
    """Stores the visit count as text, though it declares ``count`` as ``visits LONG``."""

    def handleInitialState(self, key, initialState, timerValues):
        super().handleInitialState(key, initialState, timerValues)
        self.count.update((str(self.count.get()[0]),))


class VisitsWithTtl(PageVisitsProcessor):
    """page_visits with a one-hour TTL on both variables (needs ProcessingTime mode)."""

    def init(self, handle):
        self.pages = handle.getListState("pages", "page STRING, visited_at TIMESTAMP", 3_600_000)
        self.count = handle.getValueState("count", "visits LONG", 3_600_000)


class ResortingUserSessions(UserSessionsProcessor):
    """The carried events re-sorted by ``(event_time, data)``, as before issue 16: a session
    that took a late event keeps its events in another order than the query that kept
    running."""

    def handleInitialState(self, key, initialState, timerValues):
        rows = initialState.sort_values(["event_time", "data"], kind="stable")
        self._keep_open(list(zip(rows["data"], rows["event_time"], strict=True)))


class ExpiringUserSessions(UserSessionsProcessor):
    """user_sessions whose open events expire by processing time (a TTL): another state."""

    def init(self, handle) -> None:
        super().init(handle)
        self.events = handle.getListState("events", "data STRING, event_time TIMESTAMP", 60_000)
