"""TF_CONFIG as a Gloo rendezvous (bluefog/common/tf_config.py): pure, no TensorFlow, no job.
The jobs it starts: test_gloo_backend.py's test_tf_config_starts_a_gloo_job."""

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


def layout(cluster, kind, index, **extra):
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": kind, "index": index},
                                     **extra})}


# Vertex AI: worker pool 0 is always the chief, pool 1 the workers, pools 2 and 3 a parameter
# server and an evaluator; it adds "environment" and "job" (and "trial" in the task).
VERTEX = {"chief": ["cmle-training-workerpool0-ab12-0:2222"],
          "worker": ["cmle-training-workerpool1-ab12-0:2222",
                     "cmle-training-workerpool1-ab12-1:2222"]}
# SageMaker: MultiWorkerMirroredStrategy's layout is workers only (algo-N:8890); its
# parameter-server layout is a "master", parameter servers on every host and the other workers.
SAGEMAKER_MWMS = {"worker": ["algo-1:8890", "algo-2:8890", "algo-3:8890"]}
SAGEMAKER_PS = {"master": ["algo-1:2222"], "ps": ["algo-1:2223", "algo-2:2223"],
                "worker": ["algo-2:2222"]}


@pytest.mark.parametrize("kind,index,rank", [("chief", 0, 0), ("worker", 0, 1), ("worker", 1, 2)])
def test_vertex_ai_chief_is_rank_0(kind, index, rank):
    """MultiWorkerMirroredStrategy's order: the chief is rank 0, worker i is rank i + 1, and the
    chief's address is the rendezvous on every process."""
    env = layout(VERTEX, kind, index, environment="cloud", job={"worker_pool_specs": []})
    assert rendezvous_from_tf_config(env) == {
        "MASTER_ADDR": "cmle-training-workerpool0-ab12-0", "MASTER_PORT": "2222",
        "RANK": str(rank), "WORLD_SIZE": "3"}
    alone = layout({"chief": VERTEX["chief"]}, "chief", 0)  # one replica: pool 0 only
    assert rendezvous_from_tf_config(alone)["WORLD_SIZE"] == "1"


@pytest.mark.parametrize("index", [0, 1, 2])
def test_sagemaker_workers(index):
    env = layout(SAGEMAKER_MWMS, "worker", index, environment="cloud")
    assert rendezvous_from_tf_config(env) == {
        "MASTER_ADDR": "algo-1", "MASTER_PORT": "8890", "RANK": str(index), "WORLD_SIZE": "3"}


def _cluster_refusals(cluster):
    """The error each process of the cluster gets (every task of every role)."""
    messages = []
    for kind, tasks in cluster.items():
        for index in range(len(tasks)):
            with pytest.raises(ValueError) as e:
                rendezvous_from_tf_config(layout(cluster, kind, index))
            messages.append(str(e.value))
    return messages


@pytest.mark.parametrize("cluster,named", [
    ({**VERTEX, "ps": ["cmle-training-workerpool2-ab12-0:2222"]}, "'ps'"),
    ({**VERTEX, "evaluator": ["cmle-training-workerpool3-ab12-0:2222"]}, "'evaluator'"),
    (SAGEMAKER_PS, "'master', 'ps'"),
])
def test_parameter_servers_and_evaluators_refused_everywhere(cluster, named):
    """A cluster with a ps or evaluator is refused on every process, chief and workers too, with
    one message: no subset of it may start a job of its own."""
    messages = _cluster_refusals(cluster)
    assert len(messages) == sum(len(t) for t in cluster.values())
    assert len(set(messages)) == 1, messages
    assert f"cluster lists {named}" in messages[0] and "chief or worker" in messages[0]


def test_empty_roles_are_no_tasks():
    env = layout({**SAGEMAKER_MWMS, "ps": [], "evaluator": []}, "worker", 2)
    assert rendezvous_from_tf_config(env)["RANK"] == "2"


def test_more_than_one_chief_is_refused():
    with pytest.raises(ValueError, match="2 tasks in cluster.chief"):
        rendezvous_from_tf_config(layout({"chief": ["a:1", "b:1"]}, "chief", 0))


@pytest.mark.parametrize("text,match", [
    ("{not json", "not a JSON object"),
    (json.dumps({"cluster": {}, "task": {"type": "worker", "index": 0}}), "no cluster.worker"),
    (tf_config(index=3), "task.index 3 is not a position"),
    (tf_config(index=0, workers=["nohost"]), "is not host:port"),
    (tf_config(index=0, workers=["a:1", "b:1", "a:1"]), "task.s. a:1 more than once"),
    (tf_config(index=True), "task.index True is not a position"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"cluster": ["a:1"], "task": {"type": "worker", "index": 0}}),
     "'cluster' is a list, not an object"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": "worker"}),
     "'task' is a string, not an object"),
    (json.dumps({"cluster": {"worker": ["a:1"]}, "task": ["worker", 0]}),
     "'task' is a list, not an object"),
    (json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}),
     "cluster.worker is a string, not a list"),
    (json.dumps({"cluster": {"chief": {"a": 1}}, "task": {"type": "chief", "index": 0}}),
     "cluster.chief is an object, not a list"),
    (tf_config(kind="chief", index=0), "task.index 0 is not a position in cluster.chief"),
    (tf_config(kind="ps", index=0), "task type 'ps'.*chief or worker"),
])
def test_malformed_is_named(text, match):
    with pytest.raises(ValueError, match=match):
        rendezvous_from_tf_config({"TF_CONFIG": text})
