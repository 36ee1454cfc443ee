"""Each deliberate fault of ``faulty_worlds`` makes the contract test that covers it fail.

This is how the suite shows it can fail: the same test passes on the real local World (the
control run) and fails on the local World with one behaviour broken.
"""

from __future__ import annotations

import pytest

CLASS = """
import pytest
from hypothesis import HealthCheck, Phase, settings
from world_conformance import WorldContract

class TestFaulty(WorldContract):
    world_name = {name!r}
    model_settings = settings(
        max_examples=12,
        stateful_step_count=25,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],  # finding the fault is the point here, not shrinking it
    )

    @pytest.fixture
    def world_url(self, tmp_path):
        return str(tmp_path)
"""

FAULTS = [
    ("status_ignored", "test_log_status_set_atomically"),
    ("status_ignored", "test_model_state_machine"),
    ("watch_repeats", "test_log_watch_before_log_exists"),
    ("lifo", "test_queue_fifo_for_immediate_messages"),
    ("stale_ack_accepted", "test_queue_stale_token_refused"),
    ("dedup_ignored", "test_queue_dedup_keys"),
    ("dedup_ignored", "test_model_state_machine"),
    ("negative_start_ignored", "test_stream_negative_start"),
    ("hides_outbox", "test_outbox_absent_refused"),
]

CONTROLS = sorted({test for _, test in FAULTS} - {"test_outbox_absent_refused"})
"""The same tests on the real local World (whose outbox exists, so that one test skips)."""


def _run(pytester: pytest.Pytester, test: str) -> pytest.RunResult:
    """Run one contract test of ``test_faulty.py``. Hypothesis keeps module state that an
    in-process run would split in two, so the state machine runs in a subprocess."""
    args = ["-p", "no:cacheprovider", "-W", "error", f"test_faulty.py::TestFaulty::{test}"]
    if "model" in test:
        return pytester.runpytest_subprocess(*args)
    return pytester.runpytest(*args)


@pytest.mark.parametrize(("fault", "test"), FAULTS)
def test_fault_is_caught(pytester: pytest.Pytester, fault: str, test: str) -> None:
    pytester.makepyfile(test_faulty=CLASS.format(name=f"faulty_worlds:{fault}"))
    result = _run(pytester, test)
    result.assert_outcomes(failed=1)


@pytest.mark.parametrize("test", CONTROLS)
def test_control_passes_on_local(pytester: pytest.Pytester, test: str) -> None:
    pytester.makepyfile(test_faulty=CLASS.format(name="local"))
    result = _run(pytester, test)
    result.assert_outcomes(passed=1)
