"""The elastic driver's pure logic (no MPI, no processes): host lists, discovery output,
slot assignment, the blacklist, reading mpirun's verdict; and bfrun's elastic usage errors."""

import pytest

from bluefog.run import bfrun
from bluefog.run import elastic_hosts as eh

# What Open MPI 4.1.4 printed in tests/python/test_elastic_netns.py and test_elastic.py.
LOST_DAEMON = """--------------------------------------------------------------------------
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[35756,0],0] on node bfel-h1
  Remote daemon: [[35756,0],2] on node 10.78.0.3

This is usually due to either a failure of the TCP network
"""
KILLED = ("mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 "
          "(Killed).\n")
EXITED = """mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[26535,1],2]
  Exit code:    3
"""


def test_host_specs():
    assert eh.parse_host_spec("a:2,b,10.0.0.3:1") == [("a", 2), ("b", 1), ("10.0.0.3", 1)]
    with pytest.raises(ValueError, match="listed twice"):
        eh.parse_host_spec("a:1,a:2")
    with pytest.raises(ValueError, match="at least 1"):
        eh.parse_host_spec("a:0")
    with pytest.raises(ValueError, match="'localhost:x': 'x' is not a number of slots"):
        eh.parse_host_spec("localhost:x")
    with pytest.raises(ValueError, match="'b:': '' is not a number of slots"):
        eh.parse_host_spec("a:2,b:")
    assert eh.parse_host_spec("[fe80::1]:2,[fe80::2]") == [("[fe80::1]", 2), ("[fe80::2]", 1)]
    with pytest.raises(ValueError, match="no hosts"):
        eh.parse_host_spec(",")


def test_discovery_output():
    text = "# hosts\nh1:4\n\n  h2  \nh3:1\n"
    assert eh.parse_discovery_output(text) == [("h1", 4), ("h2", 1), ("h3", 1)]
    assert eh.parse_discovery_output("") == []
    with pytest.raises(ValueError, match="discovery script line 2: 'bad host'"):
        eh.parse_discovery_output("h1\nbad host\n")


def test_assignment_fills_hosts_in_order_up_to_max_np():
    hosts = [("a", 2), ("b", 2), ("c", 1)]
    assert eh.assign(hosts, None) == hosts
    assert eh.assign(hosts, 3) == [("a", 2), ("b", 1)]
    assert eh.host_spec(eh.assign(hosts, 4)) == "a:2,b:2"
    assert eh.rank_hosts([("a", 2), ("b", 1)]) == ["a", "a", "b"]
    assert not eh.changed([("a", 2), ("b", 1)], [("b", 1), ("a", 2)])
    assert eh.changed([("a", 2), ("b", 1)], [("a", 2), ("b", 2)])
    assert eh.changed([("a", 2)], [("a", 2), ("c", 1)])


def test_blacklist_forever_or_with_a_growing_cooldown():
    forever = eh.Blacklist()
    forever.add("a", now=0)
    assert not forever.allows("a", 1e9) and forever.allows("b", 0)
    assert forever.waiting(5) == [] and forever.excluded(5) == ["a"]
    cool = eh.Blacklist(cooldown=(10, 10))
    cool.add("a", now=100)
    assert not cool.allows("a", 109) and cool.allows("a", 110)
    assert cool.waiting(105) == ["a"]
    cool.add("a", now=200)  # a second failure: twice the wait
    assert not cool.allows("a", 219) and cool.allows("a", 220)
    assert cool.filter([("a", 1), ("b", 1)], now=210) == [("b", 1)]


def test_mpirun_verdicts_name_the_host():
    three = [("10.78.0.1", 1), ("10.78.0.2", 1), ("10.78.0.3", 1)]
    assert eh.find_failures(LOST_DAEMON, three) == [
        ("10.78.0.3", "lost contact with the host's daemon (node 10.78.0.3)")]
    assert eh.find_failures(KILLED, [("localhost", 2)]) == [
        ("localhost", "rank 1 exited on signal 9")]
    assert eh.find_failures(EXITED, three) == [("10.78.0.3", "rank 2 exited with status 3")]
    assert eh.find_failures("something else went wrong", three) == []
    # Rank 1 left through Python; rank 0, a survivor, failed first: rank 1 is to blame.
    survivor = ("tensorflow.python.framework.errors_impl.AbortedError: rank 0: bluefog has been "
                "shut down (rank 1 shut down: it exited)\n" + EXITED.replace("],2]", "],0]"))
    assert eh.find_failures(survivor, three) == [
        ("10.78.0.2", "rank 1 shut down while the others still ran")]


@pytest.mark.parametrize("argv, message", [
    (["-H", "a:2", "x"], "-np N is required"),
    (["--max-np", "2", "-H", "a:2", "x"], "elastic mode needs --min-np"),
    (["--min-np", "2", "x"], "either -H host1:slots,host2:slots or --host-discovery-script"),
    (["--min-np", "2", "-H", "a:1", "--host-discovery-script", "s", "x"], "not both"),
    (["--min-np", "3", "-H", "a:1,b:1", "x"], "has 2 slot(s), fewer than --min-np 3"),
    (["--min-np", "3", "--max-np", "2", "-H", "a:4", "x"], "--max-np 2 is below --min-np 3"),
    (["--min-np", "1", "--hostfile", "h", "--host-discovery-script", "s", "x"], "not --hostfile"),
    (["--min-np", "1", "-H", "a:1", "--reset-limit", "-1", "x"], "--reset-limit must be >= 0"),
    (["--min-np", "1", "-H", "a:1", "--blacklist-cooldown-range", "5", "1", "x"],
     "0 <= MIN <= MAX"),
    (["--min-np", "1", "-H", "a:0", "x"], "at least 1"),
])
def test_elastic_usage_errors(argv, message, capsys):
    assert bfrun.main(argv) == 2
    assert message in capsys.readouterr().err
