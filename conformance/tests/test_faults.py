"""Each deliberate fault of ``faulty_worlds`` makes the contract test that covers it fail.

This is how the suite shows it can fail: the same test passes on the real local World (the
control run) and fails on the local World with one behaviour broken.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from world_conformance._support import CLAIMABLE, claim_one
from world_core import open_world

CLASS = """
import pytest
from hypothesis import HealthCheck, Phase, settings
from world_conformance import WorldContract

class TestFaulty(WorldContract):
    world_name = {name!r}
    model_settings = settings(
        max_examples=40,  # more than the default 12: a missed fault would fail this check
        # A fixed sequence of examples, checked to reach every fault below: a random one
        # missed status_ignored once in a few hundred runs, a flaky check.
        derandomize=True,
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
    ("any_cursor_accepted", "test_log_list_cursor_not_issued_refused"),
    ("any_cursor_accepted", "test_log_list_cursor_bound_to_its_listing"),
    ("lifo", "test_queue_fifo_for_immediate_messages"),
    ("stale_ack_accepted", "test_queue_stale_token_refused"),
    ("dedup_ignored", "test_queue_dedup_keys"),
    ("dedup_ignored", "test_model_state_machine"),
    ("negative_start_ignored", "test_stream_negative_start"),
    ("hides_outbox", "test_outbox_absent_refused"),
    ("dead_letters_by_enqueue", "test_queue_dead_letters_in_order_of_death"),
    ("lazy_checks", "test_log_watch_refuses_when_called"),
    ("lazy_checks", "test_stream_read_refuses_when_called"),
    ("lazy_checks", "test_world_aclose_idempotent_then_closed"),
    ("closed_before_arguments", "test_world_closed_checks_arguments_first"),
    ("closed_looks_transient", "test_world_aclose_ends_waits"),
    ("polling_declared_native", "test_process_waiters_woken_by_other_process"),
    ("streams_never_closed", "test_workspace_crash_at_every_file_step_leaves_the_clean_runs_tree"),
    ("taken_keys_dropped", "test_workspace_app_and_tool_conflicts_are_detected"),
    ("taken_keys_dropped", "test_documents_an_app_edit_is_never_lost_to_a_tool"),
    ("taken_keys_dropped", "test_documents_a_stale_tool_of_an_earlier_turn_saves_nothing"),
    ("stream_delete_ignored", "test_delete_session_leaves_nothing_of_it_and_all_of_the_other"),
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


SLOW_TESTS = [
    "test_log_concurrent_appenders_dense",
    "test_log_watch_during_concurrent_appends",
    "test_log_watch_before_log_exists",
    "test_queue_lease_expiry_redelivers",
    "test_queue_claim_wait_woken_by_enqueue",
    "test_queue_concurrent_claimers_never_share",
    "test_stream_reader_before_writer",
    "test_stream_close_races_writers",
    "test_stream_concurrent_writers_expect_next",
]


@pytest.mark.parametrize("test", SLOW_TESTS)
def test_slow_world_still_passes(pytester: pytest.Pytester, test: str) -> None:
    """The contracts assert outcomes, not speed: a World delaying every call still passes."""
    pytester.makepyfile(test_faulty=CLASS.format(name="faulty_worlds:slow"))
    _run(pytester, test).assert_outcomes(passed=1)


def test_process_contracts_skip_when_not_shared(pytester: pytest.Pytester) -> None:
    """``shared=False`` skips every test marked ``world_process`` (the journal's worker
    processes included), with the reason, instead of failing it."""
    pytester.makepyfile(test_faulty=CLASS.format(name="faulty_worlds:process_private"))
    args = ["-p", "no:cacheprovider", "-W", "error", "-v", "-rs", "-m", "world_process"]
    result = pytester.runpytest(*args)
    outcomes = result.parseoutcomes()
    assert set(outcomes) - {"deselected", "warnings"} == {"skipped"}, outcomes
    result.stdout.fnmatch_lines(["*Capabilities.shared is false (one process at a time)*"])
    for test in (
        "test_process_claimers_never_share",
        "test_journal_crash_matrix",
        "test_journal_wrong_label_duplicates",
        "test_journal_code_change_raises_nondeterminism",
        "test_journal_paused_worker_call_in_flight",
        "test_journal_sigterm_stops_claiming",
    ):
        result.stdout.fnmatch_lines([f"*::{test}* SKIPPED*"])


def test_process_contracts_catch_a_private_store_declared_shared(
    pytester: pytest.Pytester,
) -> None:
    """The control: the same process-private store declaring ``shared=True`` fails them."""
    pytester.makepyfile(
        test_faulty=CLASS.format(name="faulty_worlds:process_private_claims_shared")
    )
    _run(pytester, "test_process_claimers_never_share").assert_outcomes(failed=1)


def test_polling_world_not_declared_native_passes(pytester: pytest.Pytester) -> None:
    """The control of ``polling_declared_native``: the same watch polling every 8 s passes
    the wake-up contract when ``native_wakeups`` is left false (only being woken is asked)."""
    pytester.makepyfile(test_faulty=CLASS.format(name="faulty_worlds:polling_honest"))
    _run(pytester, "test_process_waiters_woken_by_other_process").assert_outcomes(passed=1)


def test_unwoken_watch_fails_naming_the_guarantee(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watch never woken by appends fails at the suite's bound (here 2 s) with the
    guarantee it broke, not a bare timeout of the whole test."""
    monkeypatch.setenv("WORLD_CONFORMANCE_WAIT", "2")
    pytester.makepyfile(test_faulty=CLASS.format(name="faulty_worlds:deaf_watch"))
    test = "test_faulty.py::TestFaulty::test_log_watch_after_and_wakeup"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-W", "error", test)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*AssertionError: watch(after=3) waiting at the tail is woken by later appends: "
            "only 0 of 2 items arrived within 2.0 s*"
        ]
    )


@pytest.mark.anyio
async def test_claim_one_names_the_guarantee(tmp_path: Path) -> None:
    """``claim_one`` on an empty queue says what was expected, not ``got []``."""
    async with open_world("local", url=str(tmp_path), namespace="wc_claim") as world:
        with pytest.raises(AssertionError) as caught:
            await claim_one(world, "q", "w", lease=5.0)
    message = str(caught.value)
    assert message.startswith(CLAIMABLE), message
    assert "Queue.claim('q', limit=1) by 'w' returned nothing, expected exactly one" in message
