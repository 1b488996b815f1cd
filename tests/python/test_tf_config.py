"""TF_CONFIG as a Gloo rendezvous (bluefog/common/tf_config.py): pure, no TensorFlow, no job."""

import json

import pytest

from bluefog.common.tf_config import rendezvous_from_tf_config


def tf_config(kind="worker", index=1, workers=("10.0.0.5:2222", "10.0.0.6:2222", "h7:2222"),
              **cluster):
    return json.dumps({"cluster": {"worker": list(workers), **cluster},
                       "task": {"type": kind, "index": index}})


def test_workers_become_the_rendezvous():
    assert rendezvous_from_tf_config({"TF_CONFIG": tf_config()}) == {
        "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "2222", "RANK": "1", "WORLD_SIZE": "3"}
    ipv6 = rendezvous_from_tf_config({"TF_CONFIG": tf_config(index=0, workers=["[::1]:7"])})
    assert ipv6 == {"MASTER_ADDR": "::1", "MASTER_PORT": "7", "RANK": "0", "WORLD_SIZE": "1"}


@pytest.mark.parametrize("env", [
    {},
    {"TF_CONFIG": ""},
    {"BLUEFOG_BACKEND": "mpi"},
    {"OMPI_COMM_WORLD_SIZE": "3"},
    {"PMIX_RANK": "0"},
    {"RANK": "2"},
    {"MASTER_ADDR": "elsewhere"},
])
def test_not_applied(env):
    """No TF_CONFIG, MPI asked for or launching, or the variables already set: left alone."""
    if "TF_CONFIG" not in env:
        env = {**env, "TF_CONFIG": tf_config()} if env else env
    assert rendezvous_from_tf_config(env) is None


@pytest.mark.parametrize("kind", ["chief", "ps", "evaluator"])
def test_other_roles_are_refused(kind):
    with pytest.raises(ValueError, match=f"task type '{kind}'.*every process as a worker"):
        rendezvous_from_tf_config({"TF_CONFIG": tf_config(kind=kind, index=0)})


@pytest.mark.parametrize("text,match", [
    ("{not json", "not a JSON object"),
    (json.dumps({"cluster": {}, "task": {"type": "worker", "index": 0}}), "no cluster.worker"),
    (tf_config(index=3), "task.index 3 is not a position"),
    (tf_config(index=0, workers=["nohost"]), "is not host:port"),
    (tf_config(index=0, workers=["a:1", "b:1", "a:1"]), "worker.s. a:1 more than once"),
    (tf_config(index=True), "task.index True is not a position"),
    ("[1, 2]", "not a JSON object"),
])
def test_malformed_is_named(text, match):
    with pytest.raises(ValueError, match=match):
        rendezvous_from_tf_config({"TF_CONFIG": text})
