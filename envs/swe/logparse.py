"""Reading pytest `-rA` logs: per-test status plus the run's own summary counts.

Only the LAST "short test summary info" section counts: a test's captured output (shown in
the PASSES/FAILURES sections before it) can print anything, including fake `PASSED` lines.
A test listed twice keeps its worst status. The final `N passed, M failed in Xs` line is
parsed too, so the grader can check that the lines and the counts tell the same story.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS = (
    "PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
# Worse statuses override better ones for a test reported more than once.
SEVERITY = {PASSED: 0, XPASS: 1, XFAIL: 2, SKIPPED: 3, FAILED: 4, ERROR: 5}
# pytest >= 9 reports unittest subTest / subtests results as SUB* lines; a failed subtest
# fails its test.
ALIASES = {"SUBPASSED": None, "SUBPASS": None, "SUBSKIPPED": None, "SUBFAILED": FAILED,
           "SUBFAIL": FAILED, "XPASSED": XPASS, "XFAILED": XFAIL}

HEADER_RE = re.compile(r"^=+ short test summary info =+\s*$")
# ASCII digits, at most 9 of them: the code under test prints into the same log (an atexit
# hook after pytest's summary), so a count is read only where int() is cheap and cannot raise
# (a 5,000-digit count raised ValueError, which made the rollout an env_failure)
FINAL_RE = re.compile(r"^=+ (?P<body>.*?) in [\d.]+s(?: \([^)]*\))? =+\s*$", re.ASCII)
COUNT_RE = re.compile(r"(?<!subtests )\b(\d{1,9}) (passed|failed|errors?|skipped|xfailed|"
                      r"xpassed|deselected|warnings?)\b", re.ASCII)


@dataclass
class TestLog:
    """Parsed log. `statuses`: test id → status; `counts`: the final line's numbers
    (empty when the run never printed one, e.g. it was killed or exited early)."""

    statuses: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    has_summary: bool = False

    def status(self, test_id: str) -> str | None:
        return self.statuses.get(test_id)

    def consistent(self) -> tuple[bool, str]:
        """Do the per-test lines agree with the final counts? (Forged or truncated logs don't.)"""
        if not self.has_summary or not self.counts:
            return False, "the log has no pytest summary (the run ended early or was cut)"
        listed = {s: sum(1 for v in self.statuses.values() if v == s) for s in SEVERITY}
        for status, key in ((PASSED, "passed"), (FAILED, "failed")):
            if listed[status] != self.counts.get(key, 0):
                return False, (f"{listed[status]} {status} lines but the summary says "
                               f"{self.counts.get(key, 0)} {key}")
        return True, ""


def _split_line(line: str) -> tuple[str, str] | None:
    word, _, rest = line.partition(" ")
    status = ALIASES[word] if word in ALIASES else word
    if status is None or status not in SEVERITY or not rest:
        return None
    if status == SKIPPED:
        return None  # "SKIPPED [1] path:line: reason" names no test id: a skip is "missing"
    # FAILED/ERROR/XFAIL/XPASS may carry " - message"; ids we ship never contain " - ".
    test_id = rest.split(" - ", 1)[0].rstrip()
    for prefix in ("at setup of ", "at teardown of ", "at call of "):
        test_id = test_id.removeprefix(prefix)
    return status, test_id


def parse_pytest_log(text: str) -> TestLog:
    """Parse the output of `pytest -rA` (any pytest from 7 on)."""
    lines = text.splitlines()
    start = None
    for i, line in enumerate(lines):
        if HEADER_RE.match(line):
            start = i + 1
    log = TestLog()
    if start is None:
        return log
    for line in lines[start:]:
        final = FINAL_RE.match(line)
        if final:
            log.has_summary = True
            for number, key in COUNT_RE.findall(final.group("body")):
                key = {"errors": "error", "warnings": "warning"}.get(key, key)
                log.counts[key] = log.counts.get(key, 0) + int(number)
            break
        parsed = _split_line(line.rstrip("\r"))
        if parsed is None:
            continue
        status, test_id = parsed
        old = log.statuses.get(test_id)
        if old is None or SEVERITY[status] > SEVERITY[old]:
            log.statuses[test_id] = status
    return log


PARSERS = {"pytest": parse_pytest_log}


def parse_log(parser: str, text: str) -> TestLog:
    try:
        return PARSERS[parser](text)
    except KeyError:
        raise ValueError(f"unknown log_parser {parser!r}; use one of {sorted(PARSERS)}") from None
