"""docker-compose.yml is for users: hold every service to the CLI and the settings.

There is no Docker engine here, so the file is parsed, its variables interpolated
as compose does, and checked: images, start order, commands against the real
`punctual` and Celery command lines, the shard queues split across workers by
`punctual queues`, configuration through PUNCTUAL_* only, credentials that have
no default, and ports published on this host only. `docker compose config` also
runs where the compose plugin exists.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from app.cli import main
from app.registry.sharding import queue_name
from app.settings import VARIABLES, Settings, use_settings

ROOT = Path(__file__).resolve().parents[2]
RAW = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
# What an operator sets before `docker compose up` (docker-compose.yml's header).
CREDENTIALS = {"POSTGRES_PASSWORD": "pg-secret", "RABBITMQ_PASSWORD": "mq-secret", "FLOWER_BASIC_AUTH": "a:b"}
PUNCTUAL_SERVICES = {"migrate", "api", "beat", "worker-a", "worker-b", "flower"}
# Compose's interpolation: $$, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}.
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


class Unset(Exception):
    """A required variable (${VAR:?...}) is not set: compose refuses to start."""


def interpolate(value, env: dict[str, str]):
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name, kind, word = match.group(1), match.group(2), match.group(3)
        given = env.get(name)
        missing = given is None or (given == "" and kind is not None and kind.startswith(":"))
        if missing and kind in (":?", "?"):
            raise Unset(f"{name}: {word}")
        return word if missing and kind in (":-", "-") else (given or "")

    return _VARIABLE.sub(one, value)


COMPOSE = interpolate(RAW, CREDENTIALS)
SERVICES = COMPOSE["services"]


def _command(name: str) -> list[str]:
    """The service's argv; a `sh -c '...'` command is split as its shell would."""
    argv = SERVICES[name]["command"]
    if argv[:2] == ["sh", "-c"]:
        words = shlex.split(argv[2])
        return words[1:] if words[0] == "exec" else words
    return argv


def _queues(argv: list[str]) -> list[str]:
    """A worker's -Q list, running the `$(punctual queues ...)` it gets it from."""
    value = argv[argv.index("-Q") + 1]
    computed = re.fullmatch(r"\$\(punctual (queues[^)]*)\)", value)
    if computed is None:
        return value.split(",")
    use_settings(None)  # the command reads the service's environment, as in its container
    try:
        result = CliRunner().invoke(
            main, shlex.split(computed.group(1)), env=SERVICES["worker-a"]["environment"]
        )
    finally:
        use_settings(None)
    assert result.exit_code == 0, result.output
    return result.stdout.strip().split(",")


def test_every_service_has_an_image_and_known_dependencies():
    assert PUNCTUAL_SERVICES | {"postgres-a", "postgres-b", "rabbitmq", "redis"} <= set(SERVICES)
    for name, service in SERVICES.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on", {}) or {}:
            assert dependency in SERVICES, (name, dependency)
    for name in ("postgres-a", "postgres-b", "rabbitmq", "redis", "api"):
        assert "healthcheck" in SERVICES[name], name


def test_start_order_migrates_before_anything_reads_the_registry():
    migrate_deps = SERVICES["migrate"]["depends_on"]
    assert migrate_deps["postgres-a"]["condition"] == "service_healthy"
    assert migrate_deps["postgres-b"]["condition"] == "service_healthy"
    for name in PUNCTUAL_SERVICES - {"migrate"}:
        assert SERVICES[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_configuration_is_punctual_variables_only_and_valid():
    known = {v.name for v in VARIABLES}
    for name in PUNCTUAL_SERVICES:
        env = SERVICES[name]["environment"]
        assert set(env) <= known, set(env) - known
        settings = Settings.from_env(env)  # the values themselves must validate
        assert len(settings.database_urls) == 2 and settings.shards == 16
        for dsn in settings.database_urls:
            assert any(f"@{host}:" in dsn for host in ("postgres-a", "postgres-b"))


def test_punctual_commands_exist_with_their_options():
    runner = CliRunner()
    for name in ("migrate", "api"):
        argv = _command(name)
        assert argv[0] == "punctual"
        # --help of the subcommand must list every option the service passes.
        result = runner.invoke(main, [argv[1], "--help"])
        assert result.exit_code == 0, result.output
        for option in (a for a in argv[2:] if a.startswith("--")):
            assert option.split("=")[0] in result.output, (name, option)


def test_celery_services_point_at_the_app_and_split_every_shard_queue_once():
    for name in ("beat", "worker-a", "worker-b", "flower"):
        argv = _command(name)
        assert argv[:3] == ["celery", "-A", "app"], name
    assert _command("beat")[3] == "beat" and _command("flower")[3] == "flower"
    queues: list[str] = []
    for name in ("worker-a", "worker-b"):
        argv = _command(name)
        assert argv[3] == "worker"
        assert "$(punctual queues --worker" in argv[argv.index("-Q") + 1], "a hand-written queue list"
        queues += _queues(argv)
    assert sorted(queues) == [queue_name(s) for s in range(16)]


def test_credentials_come_from_the_environment_with_no_default():
    text = (ROOT / "docker-compose.yml").read_text()
    assert "punctual:punctual" not in text and "guest" not in text
    for variable in CREDENTIALS:
        with pytest.raises(Unset, match=variable):
            interpolate(RAW, {k: v for k, v in CREDENTIALS.items() if k != variable})
    assert SERVICES["postgres-a"]["environment"]["POSTGRES_PASSWORD"] == "pg-secret"
    assert SERVICES["rabbitmq"]["environment"]["RABBITMQ_DEFAULT_PASS"] == "mq-secret"
    settings = Settings.from_env(SERVICES["api"]["environment"])
    assert all(":pg-secret@" in dsn for dsn in settings.database_urls)
    assert settings.broker_url == "amqp://punctual:mq-secret@rabbitmq:5672//"


def test_published_ports_listen_on_this_host_only_and_rabbitmqs_ui_is_not_published():
    assert "ports" not in SERVICES["rabbitmq"]
    published = [(name, port) for name, service in SERVICES.items() for port in service.get("ports", ())]
    assert published, "nothing published: the API would be unreachable"
    for name, port in published:
        assert port.startswith("127.0.0.1:"), (name, port)


def test_rabbitmq_keeps_its_messages_across_a_restart():
    rabbitmq = SERVICES["rabbitmq"]
    assert "rabbitmq:/var/lib/rabbitmq" in rabbitmq["volumes"] and "rabbitmq" in COMPOSE["volumes"]
    assert rabbitmq["hostname"] == "rabbitmq"  # the node name its data is kept under


@pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "compose", "version"], capture_output=True).returncode != 0,
    reason="the docker compose plugin is not installed here",
)
def test_docker_compose_config_accepts_the_file():
    result = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr


def _seconds(duration: str) -> float:
    """A compose duration such as `960s`, `16m` or `1m30s`."""
    import re

    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


def test_workers_get_longer_to_stop_than_the_longest_webhook_call():
    from app.services.validation import TIMEOUT_S

    for name in ("worker-a", "worker-b"):
        assert _seconds(SERVICES[name]["stop_grace_period"]) > TIMEOUT_S[1], name


def test_workers_are_health_checked_by_pinging_their_own_node_name():
    for name in ("worker-a", "worker-b"):
        argv = _command(name)
        node = argv[argv.index("-n") + 1]  # worker-a@%h: %h is the container's hostname
        kind, check = SERVICES[name]["healthcheck"]["test"]
        assert kind == "CMD-SHELL"
        assert check.startswith("celery -A app inspect ping -d ")
        # $$ is compose's escape (interpolated above): the shell in the container sees $HOSTNAME.
        assert f" -d {node.replace('%h', '$HOSTNAME')} " in check + " ", check


def test_beat_is_health_checked_by_the_age_of_the_file_it_touches():
    beat = SERVICES["beat"]
    alive = beat["environment"]["PUNCTUAL_BEAT_ALIVE_FILE"]
    assert Settings.from_env(beat["environment"]).beat_alive_file is not None
    test = beat["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"] and f"getmtime('{alive}')" in test[-1]


def test_flower_is_behind_basic_auth_from_the_environment_and_shows_queue_lengths():
    argv = _command("flower")
    [auth] = [a for a in argv if a.startswith("--basic_auth=")]
    # compose refuses to start without it (`:?`), so Flower never runs open.
    assert auth == "--basic_auth=a:b"
    [api] = [a for a in argv if a.startswith("--broker_api=")]
    assert api.endswith(":15672/api/") and "@rabbitmq:" in api
    assert "management" in SERVICES["rabbitmq"]["image"]
    [raw] = [a for a in RAW["services"]["flower"]["command"] if a.startswith("--basic_auth=")]
    assert raw.startswith("--basic_auth=${FLOWER_BASIC_AUTH:?")


def test_each_worker_serves_its_metrics_on_a_port_of_its_own():
    published = []
    for name in ("worker-a", "worker-b"):
        port = Settings.from_env(SERVICES[name]["environment"]).metrics_port
        assert port > 0, name
        [mapping] = SERVICES[name]["ports"]
        _host, host_port, container_port = mapping.split(":")
        assert int(container_port) == port
        published.append(int(host_port))
    assert len(set(published)) == 2, published


def test_each_primary_has_a_streaming_replica_that_punctual_reads():
    for primary in ("postgres-a", "postgres-b"):
        replica = SERVICES[f"{primary}-replica"]
        assert replica["image"] == SERVICES[primary]["image"]
        assert replica["depends_on"][primary]["condition"] == "service_healthy"
        script = replica["command"][-1]
        basebackup = next(line for line in script.splitlines() if "pg_basebackup" in line)
        argv = shlex.split(basebackup.split(";")[0].replace("until ", "", 1))
        assert argv[argv.index("-h") + 1] == primary and "-R" in argv  # streams from its own primary
        assert "hot_standby=on" in script
        assert replica["volumes"] != SERVICES[primary]["volumes"]
        # The primary lets it connect for replication (the image runs initdb.d scripts once).
        assert any(
            "allow-replication.sh:/docker-entrypoint-initdb.d/" in v for v in SERVICES[primary]["volumes"]
        )
    assert "replication" in (ROOT / "deploy/postgres/allow-replication.sh").read_text()
    for name in PUNCTUAL_SERVICES:
        settings = Settings.from_env(SERVICES[name]["environment"])
        hosts = [re.search(r"@([\w-]+):", dsn).group(1) for dsn in settings.replica_urls]
        assert hosts == ["postgres-a-replica", "postgres-b-replica"], name
