"""Crash injection: ``CRASH_AT=<step>:<before_run|after_run>`` ends the process there.

Used by the crash-matrix demo and the journal contracts to kill a worker at an exact point of
a turn, the way an out-of-memory kill or a redeploy would: ``os._exit(1)``, so no ``finally``
block, no atexit hook and no buffered journal write gets a chance to run.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Literal, NoReturn, cast

from world_core.errors import ConfigurationError

__all__ = [
    "CRASH_AT_VARIABLE",
    "CrashPoint",
    "SimulatedCrash",
    "crash_point_from_env",
    "parse_crash_at",
]

CRASH_AT_VARIABLE = "CRASH_AT"

When = Literal["before_run", "after_run"]


class SimulatedCrash(BaseException):
    """Raised by an ``in_process`` :class:`CrashPoint` instead of ending the process: the
    journal writes nothing more for the step, exactly as if the process had died there. A
    BaseException, so no ``except Exception`` on the way swallows it."""


@dataclass(frozen=True)
class CrashPoint:
    """Where to die: step ``step`` of any turn this process runs.

    ``before_run`` fires after the step's intent is durable (for ``never`` tools) and before the
    call starts; ``after_run`` fires after the call returned and before its outcome is written.
    Steps read back from the journal do not run, so they never fire.

    ``in_process=True`` raises :class:`SimulatedCrash` instead of ending the process, for tests
    that need the journal a crash leaves behind without a second process.
    """

    step: int
    when: When
    in_process: bool = False

    def __str__(self) -> str:
        return f"{self.step}:{self.when}"

    def hit(self) -> NoReturn:
        """End the process now with status 1, like a kill: nothing else runs (or raise
        :class:`SimulatedCrash`, ``in_process``)."""
        if self.in_process:
            raise SimulatedCrash(f"simulated crash at step {self}")
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe must not stop us
                stream.flush()
        os._exit(1)


def parse_crash_at(value: str) -> CrashPoint:
    """Parse ``<step>:<before_run|after_run>`` (``4:after_run``).

    Raises:
        ConfigurationError: anything else, naming CRASH_AT and the accepted form.
    """
    step_text, sep, when = value.strip().partition(":")
    if sep and step_text.isdigit() and when in ("before_run", "after_run"):
        return CrashPoint(int(step_text), cast(When, when))
    raise ConfigurationError(
        f"{CRASH_AT_VARIABLE}={value!r} is invalid: use <step>:before_run or <step>:after_run, "
        "for example CRASH_AT=4:after_run (steps count from 0 within a turn)"
    )


def crash_point_from_env() -> CrashPoint | None:
    """The crash point ``CRASH_AT`` asks for, or None when it is unset or empty."""
    value = os.environ.get(CRASH_AT_VARIABLE, "").strip()
    return parse_crash_at(value) if value else None
