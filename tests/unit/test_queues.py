"""`punctual queues --worker I/N`: N workers' queue lists cover every shard queue once."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from app.cli import main
from app.cli.queues import worker_shards
from app.settings import use_settings


@pytest.fixture(autouse=True)
def fresh_settings():
    """Each invocation reads its own environment, as each command's process would."""
    use_settings(None)
    yield
    use_settings(None)


@pytest.mark.parametrize("shards", [1, 2, 4, 8, 16, 64, 1024])
def test_n_workers_split_the_shards_into_contiguous_blocks_once_each(shards):
    for workers in range(1, min(shards, 40) + 1):
        blocks = [worker_shards(shards, index, workers) for index in range(1, workers + 1)]
        assert [s for block in blocks for s in block] == list(range(shards))
        sizes = [len(block) for block in blocks]
        assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
        assert sizes == sorted(sizes, reverse=True)  # the longer blocks first


def test_the_command_prints_a_workers_queues_for_celery():
    def run(*args, **kwargs):
        use_settings(None)
        return CliRunner().invoke(*args, **kwargs)

    env = {"PUNCTUAL_SHARDS": "16"}
    assert run(main, ["queues", "--worker", "2/2"], env=env).stdout == (
        "shard-08,shard-09,shard-10,shard-11,shard-12,shard-13,shard-14,shard-15\n"
    )
    assert (
        run(main, ["queues"], env={"PUNCTUAL_SHARDS": "4"}).stdout == "shard-00,shard-01,shard-02,shard-03\n"
    )
    assert (
        run(main, ["queues", "--worker", "3/3"], env=env).stdout
        == "shard-11,shard-12,shard-13,shard-14,shard-15\n"
    )
    for bad in ("0/2", "3/2", "1", "a/b"):
        result = run(main, ["queues", "--worker", bad], env=env)
        assert result.exit_code == 2 and "I/N" in result.output, bad
    idle = run(main, ["queues", "--worker", "1/32"], env=env)
    assert idle.exit_code == 2 and "idle" in idle.output
    assert run(main, ["queues"], env={"PUNCTUAL_SHARDS": "3"}).exit_code == 2  # a bad setting: one line
