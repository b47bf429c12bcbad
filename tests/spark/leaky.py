"""A deliberately broken processor: it emits timed-out sessions but forgets to clear them."""

from __future__ import annotations

import pandas as pd

from stateops.pipelines.user_sessions import _OUTPUT_COLUMNS, UserSessionsProcessor, _session_row


class ForgetfulUserSessions(UserSessionsProcessor):
    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
        (user_id,) = key
        open_events = [(d, t) for d, t in self.events.get()]
        if open_events:  # the bug: no self.events.clear()
            yield pd.DataFrame(
                [_session_row(user_id, open_events, "timeout")], columns=_OUTPUT_COLUMNS
            )
