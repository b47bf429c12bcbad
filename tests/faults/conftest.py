"""The fault-injection report, printed at the end of a session that ran the trials here (``make
faults``; under pytest-xdist the workers keep theirs, and each test prints its own)."""

from __future__ import annotations

from tests.faults.engine import REPORTS, format_report


def pytest_terminal_summary(terminalreporter) -> None:
    if REPORTS:
        terminalreporter.section("fault injection")
        for line in format_report(REPORTS).splitlines():
            terminalreporter.write_line(line)
