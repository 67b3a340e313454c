"""`punctual dev`'s plan (app.devserver.stack) and banner: pure, no processes."""

from __future__ import annotations

from pathlib import Path

from app.devserver import banner, stack
from app.services.owners import NewKey
from app.settings import Settings


def test_children_get_the_embedded_defaults_and_dev_mode_whatever_the_user_set():
    base = {
        "PATH": "/bin",
        "PUNCTUAL_DATABASE_URLS": "postgresql://db/x",
        "PUNCTUAL_REDIS_URL": "redis://r",
        "PUNCTUAL_ALLOW_PRIVATE_TARGETS": "0",
        "PUNCTUAL_LEASE_S": "30",
    }
    plan = stack.child_environment(base, Path("/data/.punctual"))
    assert plan.ignored == ("PUNCTUAL_DATABASE_URLS", "PUNCTUAL_REDIS_URL")
    env = plan.env
    assert (
        "PUNCTUAL_DATABASE_URLS" not in env
        and "PUNCTUAL_REDIS_URL" not in env
        and "PUNCTUAL_BROKER_URL" not in env
    )
    assert env["PUNCTUAL_DATA_DIR"] == "/data/.punctual" and env["PUNCTUAL_DEV_MODE"] == "1"
    assert env["PUNCTUAL_ALLOW_PRIVATE_TARGETS"] == "1"
    assert env["PUNCTUAL_LEASE_S"] == "30" and env["PATH"] == "/bin"  # the rest passes through
    settings = Settings.from_env(env)
    assert settings.embedded and settings.dev_mode and settings.allow_private_targets
    assert settings.broker() == "filesystem://" and settings.redis_url == ""
    assert settings.database_urls == ("sqlite:////data/.punctual/registry.sqlite3",)


def test_the_production_default_is_untouched():
    assert Settings.from_env({}).allow_private_targets is False
    assert Settings.from_env({}).dev_mode is False


def test_one_worker_process_consumes_every_shard_queue_and_beat_keeps_its_file_in_the_data_dir():
    settings = Settings.from_env({"PUNCTUAL_DATA_DIR": "/data/.punctual"})
    argv = stack.commands(settings, "127.0.0.1", 8123, python="py")
    worker = argv["worker"]
    assert worker[:6] == ["py", "-m", "celery", "-A", "app", "-q"] and "worker" in worker
    assert worker[worker.index("-Q") + 1].split(",") == [f"shard-{s:02d}" for s in range(16)]
    assert worker[worker.index("--pool") + 1] == "threads"  # one process: one poller, one in-process limiter
    assert "app.devserver.probe" in worker
    beat = argv["beat"]
    assert beat[beat.index("--schedule") + 1] == "/data/.punctual/celerybeat-schedule"
    api = argv["api"]
    assert api[api.index("--port") + 1] == "8123" and api[api.index("--workers") + 1] == "1"
    assert set(stack.STOP_ORDER) == set(argv) == set(stack.GRACE_S)


def test_the_banner_shows_the_credentials_and_examples_that_can_be_taken_out_of_it():
    key = NewKey("dev", "pk_abc", "whsec_xyz")
    text = banner.banner(
        "http://127.0.0.1:8123",
        key,
        Path("/d/.punctual"),
        Path("/d/.punctual/dev.env"),
        ignored=("PUNCTUAL_REDIS_URL",),
    )
    assert "pk_abc" in text and "whsec_xyz" in text and "http://127.0.0.1:8123/dev/echo" in text
    assert "PUNCTUAL_REDIS_URL" in text
    sdk = banner.example_block(text, banner.SDK_HEADING)
    assert sdk == banner.sdk_example("http://127.0.0.1:8123", "pk_abc")
    assert sdk.startswith("python - <<'EOF'") and sdk.endswith("EOF")
    compile(sdk.split("\n", 1)[1].rsplit("\n", 1)[0], "sdk-example", "exec")  # the heredoc is valid Python
    assert banner.example_block(text, banner.CURL_HEADING) == banner.curl_example(
        "http://127.0.0.1:8123", "pk_abc"
    )


def test_the_test_harness_variables_reach_a_child_without_stopping_it():
    # .ci/run exports PUNCTUAL_TEST_VENV; every child of a test inherits it.
    plan = stack.child_environment({"PUNCTUAL_TEST_VENV": ".venv"}, Path("/d"))
    assert Settings.from_env(plan.env).dev_mode
