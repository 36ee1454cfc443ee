"""The trace (issue 14): ``world trace`` of the crash matrix, the CLI, and the viewer in Chromium.

The crash matrix of ``world demo`` runs once for the module, kept for tracing: one session per
crash point. For every step of the crash agent's turn, before and after its call, a ``world
worker`` process started with ``CRASH_AT=<step>:<when>`` dies there (``os._exit(1)``); then a
worker in this process continues the turn once the dead worker's lease has run out (and, for
``send_email``, once its deadline has passed). Every test reads those sessions from the local
World's folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from world_core import Client, Journal, Worker, open_world, tool
from world_core._cli import main
from world_core.observe import SessionTrace
from world_examples.crash_agent import MESSAGE, build_agent
from world_examples.inbox import Inbox

STEPS = ["model", "lookup_note", "model", "send_email", "model"]
POINTS = [f"{n}:{when}" for n in range(len(STEPS)) for when in ("before_run", "after_run")]
NAMESPACE = "trace"
TURN = "t1"
LEASE = 1.0


@dataclass(frozen=True)
class Matrix:
    """Where the sessions are: the local World's folder and namespace, crash point -> session."""

    folder: Path
    namespace: str
    sessions: dict[str, str]
    env: dict[str, str]
    """What a ``world`` process needs to open the same World (and run the agent's tools)."""


def session_of(point: str) -> str:
    return "crash-" + point.replace(":", "-").replace("_", "-")


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def build_matrix(folder: Path, points: list[str] = POINTS) -> Matrix:
    """Run the crash points (worker processes crash, this process resumes); see the module."""
    data = folder / "world"
    mail = folder / "mail"
    with Inbox(mail) as inbox:
        env = {
            "WORKFLOW_TARGET_WORLD": "local",
            "WORKFLOW_LOCAL_DIR": str(data),
            "WORKFLOW_NAMESPACE": NAMESPACE,
            "WORLD_DEMO_SMTP": f"127.0.0.1:{inbox.port}",
            "WORLD_DEMO_MAILDIR": str(mail),
            "WORLD_DEMO_SEND_REPLAY": "never",
        }
        sessions = {point: session_of(point) for point in points}

        async def submit() -> None:
            async with open_world("local", namespace=NAMESPACE) as world:
                for n, point in enumerate(points):
                    await Client(world, queue=f"q{n}").submit(
                        sessions[point], MESSAGE, turn_id=TURN
                    )

        with _environ(env):
            anyio.run(submit)
        base = {k: v for k, v in os.environ.items() if not k.startswith("WORKFLOW_")}
        base.pop("CRASH_AT", None)
        processes = []
        for n, point in enumerate(points):
            command = [sys.executable, "-m", "world_core._cli", "worker", "--once"]
            command += ["--agent", "world_examples.crash_agent:build_agent", "--queue", f"q{n}"]
            command += ["--lease", str(LEASE), "--wait", "60"]
            processes.append(
                subprocess.Popen(
                    command,
                    env={**base, **env, "CRASH_AT": point},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            )
        for process in processes:
            _, err = process.communicate(timeout=120)
            assert process.returncode == 1, err.decode(errors="replace")  # it crashed

        async def resume() -> None:
            async with open_world("local", namespace=NAMESPACE) as world:

                async def one(n: int, point: str) -> None:
                    worker = Worker(
                        world,
                        build_agent,
                        queue=f"q{n}",
                        lease=5.0,
                        name=f"resumer-{n}",
                        crash=None,
                        retry_delay=0.2,
                    )
                    client = Client(world, queue=f"q{n}")
                    with anyio.fail_after(60):
                        while await client.reply(sessions[point], TURN) is None:
                            await worker.run_once(wait=10)

                async with anyio.create_task_group() as tg:
                    for n, point in enumerate(points):
                        tg.start_soon(one, n, point)

        with _environ(env):
            anyio.run(resume)
        assert all(len(inbox.messages(s)) == 1 for s in sessions.values())
    return Matrix(folder=data, namespace=NAMESPACE, sessions=sessions, env=env)


CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
COMMAND = [sys.executable, "-m", "world_core._cli"]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    return build_matrix(tmp_path_factory.mktemp("matrix"))


@pytest.fixture
def world_env(matrix: Matrix, monkeypatch: pytest.MonkeyPatch) -> Matrix:
    for key, value in matrix.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("NO_COLOR", raising=False)
    return matrix


def _world(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    out, err = capsys.readouterr()
    return status, out, err


def _trace(session: str, capsys: pytest.CaptureFixture[str], *extra: str) -> SessionTrace:
    status, out, err = _world(["trace", session, "--json", *extra], capsys)
    assert status == 0, err
    return SessionTrace.model_validate_json(out)


# -- (a) the crash matrix ------------------------------------------------------------------------


def test_every_crash_point_shows_where_the_turn_stopped_and_where_it_resumed(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    for point in POINTS:
        crashed_at = int(point.split(":")[0])
        trace = _trace(world_env.sessions[point], capsys)
        assert trace.format == "world-trace/1"
        (turn,) = trace.turns
        assert turn.status == "done", point
        assert len(turn.stops) == 1, (point, turn.stops)
        stop = turn.stops[0]
        assert stop.reason == "stopped", point
        resumed = turn.runs[stop.resumed_run - 1] if stop.resumed_run else None
        assert resumed is not None, point
        assert resumed.worker is not None, point
        assert resumed.worker.startswith("resumer-"), point
        assert resumed.ended == "finished", point
        if stop.run is None:
            # Killed before its first write: nothing of that run is in the log; the message's
            # next delivery did all the work.
            assert crashed_at == 0, point
            assert stop.resumed_step == 0, point
            assert resumed.attempt == 2, point
            assert turn.runs[0].replayed_steps == 0, point
        else:
            crashed = turn.runs[stop.run - 1]
            assert crashed.ended == "stopped", point
            assert crashed.attempt == 1, point
            assert crashed.worker is not None
            assert not crashed.worker.startswith("resumer-")
            assert stop.worker == crashed.worker
            assert stop.resumed_attempt is not None
            assert stop.resumed_attempt > crashed.attempt
            assert stop.step is not None
            assert stop.resumed_step is not None
            if point.startswith("3:"):
                # send_email (never): its intent is durable, its outcome is not; the next run
                # answers for it (possibly ran) after its deadline, at that very step.
                assert stop.at_step == "intent_without_outcome", point
                assert stop.step == stop.resumed_step == 3, point
                send = turn.steps[3]
                assert send.status == "possibly_ran", point
                assert [a.status for a in send.attempts] == ["interrupted", "possibly_ran"]
                assert [a.run for a in send.attempts] == [crashed.index, resumed.index]
                assert send.replay == "never"
                assert send.deadline is not None
            else:
                # The last durable record is an outcome before the crash point; the next run
                # starts its new work right after it.
                assert stop.at_step == "after_outcome", point
                assert stop.step < crashed_at or (stop.step == crashed_at == 3), point
                assert stop.resumed_step == stop.step + 1, point
            for step in turn.steps:
                if step.step < stop.resumed_step:
                    # Before the resume point: recorded by the crashed run, read back after.
                    assert step.replayed, (point, step)
                    assert [a.run for a in step.attempts] == [crashed.index, resumed.index]
                    assert step.attempts[-1].status == "replayed"
            assert resumed.replayed_steps == stop.resumed_step, point
        assert stop.resumed_at is not None
        # Steps have times, runs and identities from journal positions.
        for step in turn.steps:
            assert step.id == f"{trace.session}/{TURN}/{step.step}"
            assert step.ended_at is not None, (point, step)
            assert step.started_at is not None, (point, step)
            assert step.content is None
        assert turn.submitted_at is not None
        assert turn.ended_at is not None
        assert turn.steps[-1].kind == "model"


# -- (b) the CLI ------------------------------------------------------------------------------


def test_world_trace_prints_a_tree_with_the_stop_and_the_resume(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    session = world_env.sessions["3:before_run"]
    status, out, _ = _world(["trace", session], capsys)
    assert status == 0
    print(out)  # the closing note's example
    assert "\033[" not in out  # not a terminal: no colour
    assert re.search(r"✗ STOPPED at step 3 \(intent recorded, no outcome\)", out)
    assert re.search(r"↻ RESUMED by run 2 on resumer-\d+ \(delivery \d\) at step 3", out)
    assert re.search(r"step 3 +tool send_email +possibly_ran", out)
    assert "run 1: " in out
    assert "run 2: resumer-" in out
    assert MESSAGE not in out
    assert "content hidden" in out
    status, shown, _ = _world(["trace", session, "--content", "--turn", TURN], capsys)
    assert status == 0
    assert MESSAGE in shown
    assert "input:" in shown


def test_content_is_hidden_unless_asked_for(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    session = world_env.sessions["1:after_run"]
    status, out, _ = _world(["trace", session, "--json"], capsys)
    assert status == 0
    assert MESSAGE not in out
    assert "launch note" not in out.lower()
    document = json.loads(out)
    assert document["content"] is False
    assert all(s["content"] is None for t in document["turns"] for s in t["steps"])
    shown = _trace(session, capsys, "--content")
    assert shown.content is True
    assert shown.turns[0].content is not None
    assert shown.turns[0].content["message"] == MESSAGE


def test_secrets_are_never_shown(
    world_env: Matrix, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def configure(api_key: str, endpoint: str, headers: dict[str, str]) -> dict[str, Any]:
        """Pretend to configure a client."""
        return {"ok": True, "token": api_key, "endpoint": endpoint}

    async def run() -> None:
        async with open_world("local", namespace=world_env.namespace) as world:
            await Client(world).submit("secrets", "configure the client", turn_id="t1")
            journal = await Journal.open(world, "secrets", "t1")
            await journal.call(
                tool(configure, replay="never"),
                {
                    "api_key": "sk-live-SECRET1",
                    "endpoint": "https://bob:SECRET2@api.example.com/v1",
                    "headers": {"Authorization": "Bearer SECRET3abcdefgh", "x-ok": "fine"},
                },
            )
            await journal.finish("configured")

    anyio.run(run)
    for extra in ([], ["--json"]):
        status, out, _ = _world(["trace", "secrets", "--content", *extra], capsys)
        assert status == 0
        for secret in ("SECRET1", "SECRET2", "SECRET3"):
            assert secret not in out, (extra, out)
        assert "***" in out
        assert "api.example.com" in out
    trace = _trace("secrets", capsys, "--content")
    step = trace.turns[0].steps[0]
    assert step.content is not None
    assert step.content["input"]["api_key"] == "***"
    assert step.content["input"]["headers"] == {"Authorization": "***", "x-ok": "fine"}
    assert step.content["output"]["token"] == "***"
    assert step.content["output"]["ok"] is True


def test_world_sessions_lists_newest_first_filters_and_pages(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    status, out, _ = _world(["sessions", "--json", "--limit", "1000"], capsys)
    assert status == 0
    listed = json.loads(out)["sessions"]
    names = [s["session"] for s in listed]
    assert set(world_env.sessions.values()) <= set(names)
    times = [s["updated_at"] for s in listed]
    assert times == sorted(times, reverse=True)
    seen: list[str] = []
    cursor: list[str] = []
    for _ in range(20):
        status, out, _ = _world(["sessions", "--json", "--limit", "3", *cursor], capsys)
        page = json.loads(out)
        seen += [s["session"] for s in page["sessions"]]
        if page["next_cursor"] is None:
            break
        cursor = ["--cursor", page["next_cursor"]]
    assert seen == names
    status, out, _ = _world(["sessions", "--limit", "2", "--page", "2"], capsys)
    assert status == 0
    assert names[2] in out
    assert names[0] not in out
    status, out, _ = _world(["sessions", "--status", "failed"], capsys)
    assert status == 0
    assert "no sessions with status failed" in out
    status, out, _ = _world(["sessions", "--status", "done", "--json"], capsys)
    assert {s["status"] for s in json.loads(out)["sessions"]} == {"done"}


HISTORIES = Path(__file__).resolve().parents[1] / "histories"


@pytest.mark.parametrize("name", ["clean", "crashed-after-send", "open-turn"])
def test_world_trace_reads_exported_histories_written_before_runs_and_times(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = HISTORIES / f"{name}.json"
    session = json.loads(path.read_text())["sessions"][0]["session_id"]
    trace = _trace(session, capsys, "--file", str(path))
    assert trace.turns
    steps = [step for turn in trace.turns for step in turn.steps]
    assert steps
    assert all(step.started_at is None and step.ended_at is None for step in steps)
    assert all(run.worker is None for turn in trace.turns for run in turn.runs)
    if name == "crashed-after-send":
        # Crashed after the send: told it may have happened, the agent checked and found it.
        assert [s.status for s in steps if s.name == "send_email"] == ["possibly_ran"]
        assert [s.name for s in steps][-2:] == ["check_sent", "model"]
    status, out, _ = _world(["trace", session, "--file", str(path)], capsys)
    assert status == 0
    assert f"session {session}" in out
    status, _, err = _world(["trace", "nobody", "--file", str(path)], capsys)
    assert status == 2
    assert f"holds no session 'nobody' (it holds: {session})" in err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["trace", "no-such-session"], "session 'no-such-session' has no events"),
        (["trace", "crash-1-after-run", "--turn", "t9"], "has no turn 't9'"),
        (["trace", "bad/../id"], "session"),
        (["sessions", "--cursor", "garbage"], "is not a next_cursor"),
        (["sessions", "--status", "done", "--page", "1", "--cursor", "x"], "not both"),
    ],
)
def test_bad_arguments_give_a_clear_error(
    world_env: Matrix, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    status, out, err = _world(args, capsys)
    assert status == 2
    assert out == ""
    assert says in err, err
    assert err.startswith("world: error:"), err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["sessions", "--status", "bogus"], "--status: invalid choice: 'bogus'"),
        (["sessions", "--limit", "0"], "--limit must be from 1 to 1000"),
        (["tail", "s", "--deadline", "-1"], "--deadline must be seconds > 0"),
        (["ui", "--port", "70000"], "--port must be from 0 to 65535"),
    ],
)
def test_bad_options_are_refused_by_the_parser(
    world_env: Matrix, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(args)
    assert stopped.value.code == 2
    assert says in capsys.readouterr().err


def test_world_ui_on_a_taken_port_says_so(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status, _, err = _world(["ui", "--port", str(port)], capsys)
    assert status == 2
    assert f"world ui cannot listen on 127.0.0.1:{port}" in err
    assert "pick another --port" in err


def _run_turn(world_env: Matrix, session: str, queue: str) -> None:
    async def run() -> None:
        async with open_world("local", namespace=world_env.namespace) as world:
            worker = Worker(world, build_agent, queue=queue, lease=5.0, name="live", crash=None)
            with anyio.fail_after(60):
                while await Client(world, queue=queue).reply(session, "t1") is None:
                    await worker.run_once(wait=5)

    anyio.run(run)


def _submit(world_env: Matrix, session: str, queue: str) -> None:
    async def submit() -> None:
        async with open_world("local", namespace=world_env.namespace) as world:
            await Client(world, queue=queue).submit(session, MESSAGE, turn_id="t1")

    anyio.run(submit)


def test_world_tail_follows_a_turn_until_it_ends(
    world_env: Matrix, capsys: pytest.CaptureFixture[str]
) -> None:
    _submit(world_env, "tailed", "tail-q")
    status, _, err = _world(["tail", "tailed", "--deadline", "0.5"], capsys)
    assert status == 1
    assert "did not end within --deadline 0.5 s" in err
    env = {**os.environ, **world_env.env}
    follower = subprocess.Popen(
        [*COMMAND, "tail", "tailed", "--turn", "t1", "--deadline", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        first = follower.stdout.readline()  # it runs: it printed the queued turn
        assert first.startswith("turn t1"), first
        _run_turn(world_env, "tailed", "tail-q")
        out, err = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait()
    assert follower.returncode == 0, err
    assert "step 3   tool send_email" in out
    assert "reply at" in out


# -- (c) the viewer in a real headless Chromium ------------------------------------------------


@pytest.fixture(scope="module")
def viewer(matrix: Matrix) -> Iterator[str]:
    """One ``world ui`` process for the module's browser tests."""
    env = {**os.environ, **matrix.env}
    with subprocess.Popen(
        [*COMMAND, "ui", "--port", "0", "--poll", "0.3"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
            found = re.search(r"at (http://127\.0\.0\.1:\d+/)", line)
            assert found, line + server.stdout.read()
            yield found.group(1)
        finally:
            server.terminate()
            server.wait(timeout=30)


def _artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("WORLD_TEST_ARTIFACTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _chromium_required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or bool(os.environ.get("WORLD_REQUIRE"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        message = (
            f"the browser test needs {CHROMIUM} and {CHROMEDRIVER} "
            "(apt-get install chromium chromium-driver)"
        )
        if _chromium_required():
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(argument)
    options.add_argument("--window-size=1400,900")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_viewer_shows_the_crash_and_the_resume_in_chromium(
    world_env: Matrix, viewer: str, browser: Any, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 20)
    session = world_env.sessions["3:before_run"]
    browser.get(viewer)
    wait.until(
        ec.presence_of_element_located((By.CSS_SELECTOR, f'nav a[data-session="{session}"]'))
    )
    browser.find_element(By.CSS_SELECTOR, f'nav a[data-session="{session}"]').click()
    resume = wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".marker.resume")))
    assert "resumed by run 2" in resume.text
    assert "at step 3" in resume.text
    assert resume.get_attribute("data-resume-step") == "3"
    stop = browser.find_element(By.CSS_SELECTOR, ".marker.stop")
    assert "stopped at step 3" in stop.text
    send = browser.find_element(By.CSS_SELECTOR, '.run[data-run="2"] .step[data-step="3"]')
    assert send.get_attribute("data-status") == "possibly_ran"
    send.click()
    details = wait.until(ec.visibility_of_element_located((By.ID, "details")))
    assert "interrupted" in details.text
    assert "possibly_ran" in details.text
    assert "content hidden" in details.text
    screenshot = _artifacts(tmp_path) / "world-ui-crash-resume.png"
    assert browser.save_screenshot(str(screenshot))
    print(f"screenshot: {screenshot}")
    assert screenshot.stat().st_size > 10_000


def test_the_viewer_updates_a_running_turn_live_in_chromium(
    world_env: Matrix, viewer: str, browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _submit(world_env, "live", "live-q")
    browser.get(viewer + "#live")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: d.find_element(By.ID, "trace").get_attribute("data-status") == "queued")
    _run_turn(world_env, "live", "live-q")  # no reload: the page polls while the turn is open
    wait.until(lambda d: d.find_element(By.ID, "trace").get_attribute("data-status") == "done")
    assert len(browser.find_elements(By.CSS_SELECTOR, ".step")) == 5


def test_the_viewer_api_refuses_bad_input_and_foreign_hosts(viewer: str) -> None:
    import urllib.error
    import urllib.request

    def get(path: str, host: str | None = None) -> tuple[int, dict[str, Any]]:
        request = urllib.request.Request(viewer.rstrip("/") + path)
        if host is not None:
            request.add_header("Host", host)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    assert get("/api/trace")[0] == 400
    status, body = get("/api/trace?session=nobody")
    assert status == 404
    assert "has no events" in body["error"]
    status, body = get("/api/sessions?status=bogus")
    assert status == 400
    assert "status must be one of" in body["error"]
    assert get("/api/config", host="evil.example:80")[0] == 403
    status, body = get("/api/config")
    assert status == 200
    assert body["content"] is False
