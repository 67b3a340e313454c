"""Flower, seen in a real browser: the worker, the dispatch tasks by what they carry, the queues.

Real processes on real services: beat, a worker and Flower (as docker-compose.yml
runs it: basic auth, --broker_api on RabbitMQ's management API) on a fresh vhost
and fresh Postgres shards, and headless Chromium from Debian's packages driven by
selenium through /usr/bin/chromedriver. The browser sends the basic-auth header on
every request (Chrome DevTools' extra headers), so the pages' own XHRs work as a
user's browser does after logging in.

Order matters: a job due now on every shard before the worker starts, so beat's
polls (sent only to shards with work) wait in the shard queues and the Broker page
has message counts to show; then the worker starts and a job due now makes one
dispatch task. The Tasks page must list that dispatch by
its descriptive name (`punctual.dispatch shard-NN xN`) and no poll or sweep, though
hundreds ran. Screenshots of the three pages are kept in the test's tmp dir.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import socket
import time

import pytest
import requests

from app.api import create_app
from app.core.timefmt import format_instant, utcnow
from app.registry.engines import registry_for
from app.registry.sharding import shard_for
from app.services.owners import create_key
from app.settings import Settings
from tests.e2e.processes import CELERY, Proc, start_beat, wait_ready
from tests.sink import Sink

pytestmark = pytest.mark.integration

SHARDS = 4
PG_SHARDS = SHARDS  # the cluster pg_dsns makes (tests/conftest.py)
AUTH = ("punctual", "flower-test")
MANAGEMENT_API = os.environ.get("PUNCTUAL_TEST_RABBITMQ_API", "http://guest:guest@127.0.0.1:15672/api/")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
RELOAD_EVERY_S = 4.0
BROWSER_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1600,1000",
)

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    if os.environ.get("CI"):
        raise RuntimeError("CI needs chromium and chromium-driver (scripts/test installs them as root)")
    pytest.skip(
        "chromium / chromium-driver not installed (apt-get install chromium chromium-driver)",
        allow_module_level=True,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_for(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001  (a page still loading; try again)
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"{what} not within {timeout_s:g}s (last: {last!r})")


@pytest.fixture(scope="module")
def env(pg_dsns, amqp_url) -> dict[str, str]:
    return {
        "PUNCTUAL_DATABASE_URLS": ",".join(pg_dsns),
        "PUNCTUAL_BROKER_URL": amqp_url,
        "PUNCTUAL_SHARDS": str(SHARDS),
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "1",
        "PUNCTUAL_DB_POOL_SIZE": "2",
        "PUNCTUAL_DISPATCH_THREADS": "8",
    }


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium fetch a driver or a browser
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in BROWSER_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        token = base64.b64encode(f"{AUTH[0]}:{AUTH[1]}".encode()).decode()
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {token}"}}
        )
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def stack(env, tmp_path_factory):
    logs = tmp_path_factory.mktemp("flower-logs")
    port = _free_port()
    processes: dict[str, Proc] = {}
    try:
        processes["beat"] = start_beat(env, logs)
        flower = Proc(
            "flower",
            [
                CELERY,
                "-A",
                "app",
                "flower",
                f"--port={port}",
                "--address=127.0.0.1",
                f"--basic_auth={AUTH[0]}:{AUTH[1]}",
                f"--broker_api={MANAGEMENT_API}",
            ],
            env,
            logs,
        )
        processes["flower"] = flower
        url = f"http://127.0.0.1:{port}"
        _wait_for(lambda: requests.get(f"{url}/healthcheck", timeout=2).ok, 60, "Flower answering")
        yield url, processes, logs
    finally:
        for proc in reversed(list(processes.values())):
            proc.stop(timeout_s=15)


def _start_worker(env, processes, logs) -> Proc:
    # As docker-compose.yml starts workers: gossip, mingle and heartbeats on, so the
    # worker has an event dispatcher that Flower's enable_events switches on.
    queues = ",".join(f"shard-{s:02d}" for s in range(SHARDS))
    worker = Proc(
        "worker",
        [
            CELERY,
            "-A",
            "app",
            "worker",
            "--loglevel",
            "INFO",
            "-n",
            "flower-test@%h",
            "-Q",
            queues,
            "-c",
            "2",
        ],
        env,
        logs,
    )
    processes["worker"] = worker
    wait_ready(worker, 2.0)
    return worker


def _page(browser, url: str, shot, ready, what: str) -> str:
    loaded = [0.0]

    def _check():
        # Reload now and then: the Broker page is drawn once per load (and RabbitMQ's
        # counts of a new queue appear after its first stats interval, ~5 s).
        if time.monotonic() - loaded[0] > RELOAD_EVERY_S:
            browser.get(url)
            loaded[0] = time.monotonic()
        body = browser.find_element("tag name", "body").text
        return body if ready(body) else None

    try:
        text = _wait_for(_check, 60, what)
    except AssertionError as exc:
        browser.save_screenshot(str(shot))
        page_text = browser.find_element("tag name", "body").text
        raise AssertionError(f"{exc}; the page ({shot}) reads:\n{page_text}") from None
    browser.save_screenshot(str(shot))
    assert shot.stat().st_size > 10_000, "an empty screenshot"
    return text


def _unwrapped(text: str) -> str:
    """A page's text without the line breaks a narrow table column puts inside a name."""
    return "".join(text.split())


def _job_creator(env):
    """Creates a job due now calling a path of a sink; returns its id."""
    settings = Settings.from_env(env)
    key = create_key(registry_for(settings), "flower")
    client = create_app(settings).test_client()

    def create(sink: Sink, path: str) -> str:
        body = {
            "name": "flower",
            "target": {"type": "webhook", "url": sink.url(path)},
            "schedule": {"run_at": format_instant(utcnow())},
        }
        response = client.post("/jobs", json=body, headers={"Authorization": f"Bearer {key.api_key}"})
        assert response.status_code == 201, response.get_json()
        return response.get_json()["id"]

    return create


def _due_on_every_shard(create, sink: Sink) -> int:
    """Jobs due now until every shard holds one (beat polls only shards with work)."""
    shards: set[int] = set()
    created = 0
    while len(shards) < SHARDS:
        assert created < 200, f"200 jobs landed on shards {sorted(shards)} only"
        shards.add(shard_for(create(sink, "/early"), SHARDS))
        created += 1
    return created


@pytest.fixture
def sink():
    sink = Sink()
    yield sink
    sink.close()


def test_flower_shows_queues_the_worker_and_dispatches_by_name_without_polls(
    stack, env, browser, sink, tmp_path
):
    url, processes, logs = stack
    shots = tmp_path
    create = _job_creator(env)
    early = _due_on_every_shard(create, sink)

    # Broker: beat's polls wait in every shard queue while no worker consumes them.
    def _queues_with_messages(text: str) -> dict[str, int]:
        found = {m.group(1): int(m.group(2)) for m in re.finditer(r"(shard-\d\d)\s+(\d+)", text)}
        return found if len(found) == SHARDS and all(found.values()) else {}

    broker_text = _page(
        browser,
        f"{url}/broker",
        shots / "broker.png",
        _queues_with_messages,
        "the shard queues with messages on the Broker page",
    )
    queues = _queues_with_messages(broker_text)
    assert sorted(queues) == [f"shard-{s:02d}" for s in range(SHARDS)], broker_text
    assert "No queue data" not in broker_text

    worker = _start_worker(env, processes, logs)
    # Flower switches the worker's task events on a few seconds after it appears; a
    # dispatch before that would send no events, and Flower would never hear of it.
    _wait_for(
        lambda: "enabled by remote" in worker.log_path.read_text(errors="replace"),
        60,
        "Flower switching the worker's task events on",
    )
    sink.wait_for(early, "/early", timeout_s=60)
    job_id = create(sink, "/f")
    sink.wait_for(1, "/f", timeout_s=60)

    workers_text = _page(
        browser,
        f"{url}/workers",
        shots / "workers.png",
        lambda body: "flower-test@" in _unwrapped(body),
        "the worker on the Workers page",
    )
    assert "Online" in workers_text, worker.tail()

    tasks_text = _page(
        browser,
        f"{url}/tasks",
        shots / "tasks.png",
        lambda body: re.search(r"punctual\.dispatch\s*shard-\d\d\s*x1\b", body),
        "the dispatch task, by its descriptive name, on the Tasks page",
    )
    assert "punctual.poll" not in tasks_text and "punctual.sweep" not in tasks_text, tasks_text
    # The same from Flower's API: every task it knows is a dispatch, and it carried the job's run.
    tasks = requests.get(f"{url}/api/tasks", auth=AUTH, timeout=10).json()
    names = {task["name"] for task in tasks.values()}
    assert names and all(re.fullmatch(r"punctual\.dispatch shard-\d\d x\d+", name) for name in names), names
    assert any(job_id in (task.get("kwargs") or "") for task in tasks.values())
    print(f"screenshots: {shots}")
