"""The broker's scheduler count that `deploy/setup.sh` keeps across restarts (docs/operations.md):
`deploy/rabbitmq/keep-schedulers.sh` writes it into RabbitMQ's environment file, once, and
leaves an operator's own line alone; a node booted with that file runs that many schedulers."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.private_rabbit import private_rabbit

SCRIPT = Path(__file__).resolve().parents[1] / "deploy" / "rabbitmq" / "keep-schedulers.sh"
DEBIAN_LINES = 'NODENAME=rabbit@localhost\nexport ERL_FLAGS="-kernel inet_dist_use_interface {127,0,0,1}"\n'


def keep(conf: Path, count: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), str(conf), count], capture_output=True, text=True, timeout=30)


def scheduler_lines(conf: Path) -> list[str]:
    return [line for line in conf.read_text().splitlines() if "SERVER_ADDITIONAL_ERL_ARGS" in line]


def test_the_line_is_written_once_and_replaced_by_a_new_count(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq-env.conf"
    conf.write_text(DEBIAN_LINES)
    assert keep(conf, "1").returncode == 0
    assert keep(conf, "1").returncode == 0
    assert [line.split("  #")[0] for line in scheduler_lines(conf)] == ['SERVER_ADDITIONAL_ERL_ARGS="+S 1:1"']
    assert keep(conf, "2").returncode == 0
    assert [line.split("  #")[0] for line in scheduler_lines(conf)] == ['SERVER_ADDITIONAL_ERL_ARGS="+S 2:2"']
    assert conf.read_text().startswith(DEBIAN_LINES)  # the file's other lines stay


def test_a_missing_file_is_created(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq-env.conf"
    assert keep(conf, "1").returncode == 0
    assert len(scheduler_lines(conf)) == 1


def test_an_operators_own_args_are_left_alone(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq-env.conf"
    theirs = 'SERVER_ADDITIONAL_ERL_ARGS="+P 2000000"\n'
    conf.write_text(theirs)
    result = keep(conf, "1")
    assert result.returncode == 0
    assert conf.read_text() == theirs
    assert "without +S" in result.stdout  # said: their broker keeps its default schedulers


def test_what_is_not_a_count_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq-env.conf"
    conf.write_text(DEBIAN_LINES)
    for bad in ("0", "two", "1; rm -rf /", ""):
        result = keep(conf, bad)
        assert result.returncode == 2, bad
    assert conf.read_text() == DEBIAN_LINES


def test_a_node_booted_with_the_file_runs_that_many_schedulers(tmp_path: Path) -> None:
    conf = tmp_path / "rabbitmq-env.conf"
    conf.write_text(DEBIAN_LINES)
    assert keep(conf, "1").returncode == 0
    with private_rabbit(env_file=conf) as node:
        assert node.erlang_eval("{erlang:system_info(schedulers), erlang:system_info(schedulers_online)}.") \
            == "{1,1}"
