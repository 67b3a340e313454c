"""CPU accounting of the benchmarks from /proc/<pid>/stat lines (fake ones here)."""

from bench.cpu import TICKS_PER_S, ProcStat, cpu_delta_s, parse_stat, per_run_ms, server_roots, tree_ticks


def stat_line(pid, comm, ppid, utime, stime, cutime=0, cstime=0):
    # fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority ...
    return (
        f"{pid} ({comm}) S {ppid} {pid} {pid} 0 -1 4194560 100 0 0 0 {utime} {stime} {cutime} {cstime}"
        " 20 0 1 0 12345 1000000 500 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
    )


def test_parse_stat_sums_own_and_waited_children_ticks():
    stat = parse_stat(stat_line(42, "celery", 1, utime=100, stime=20, cutime=5, cstime=3))
    assert stat == ProcStat(pid=42, ppid=1, comm="celery", ticks=128)


def test_parse_stat_command_names_with_spaces_and_parentheses():
    stat = parse_stat(stat_line(7, "postgres: bench (idle) )", 3, utime=9, stime=1))
    assert (stat.pid, stat.ppid, stat.comm, stat.ticks) == (7, 3, "postgres: bench (idle) )", 10)


def table(*stats):
    return {s.pid: s for s in stats}


def test_tree_ticks_counts_every_descendant_once():
    procs = table(
        ProcStat(1, 0, "init", 1000),
        ProcStat(10, 1, "celery", 50),
        ProcStat(11, 10, "celery", 30),
        ProcStat(12, 11, "celery", 7),
        ProcStat(20, 1, "beat", 9),
    )
    assert tree_ticks(procs, [10]) == 87
    assert tree_ticks(procs, [10, 11]) == 87  # a root inside another root's tree is not counted twice
    assert tree_ticks(procs, [10, 20]) == 96
    assert tree_ticks(procs, [999]) == 0  # gone


def test_server_roots_are_the_masters_only():
    procs = table(
        ProcStat(1, 0, "init", 0),
        ProcStat(100, 1, "postgres", 5),
        ProcStat(101, 100, "postgres", 5),
        ProcStat(200, 1, "redis-server", 1),
    )
    assert server_roots(procs, "postgres") == [100]
    assert server_roots(procs, "beam.smp") == []


def test_delta_and_per_run():
    cpu = cpu_delta_s({"a": 0, "b": 10}, {"a": 2 * TICKS_PER_S, "b": 10 + TICKS_PER_S, "c": TICKS_PER_S})
    assert cpu == {"a": 2.0, "b": 1.0, "c": 1.0}
    assert per_run_ms(cpu, 1000, not_in_total=("c",)) == {"a": 2.0, "b": 1.0, "c": 1.0, "total": 3.0}
