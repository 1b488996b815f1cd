"""The Kubernetes manifests in examples/kubernetes/ against their schemas.

No cluster runs here, so what can be checked without one is checked strictly: every document
parses, names a kind we know the schema of, and has no field its schema lacks and no value of
the wrong type. Kubernetes' own kinds (Job, Service) go through kubernetes-validate (the API's
JSON schemas, strict). The operators' kinds are walked field by field: TFJob against the
training operator's generated Python models (kubeflow-training), the MPI Operator's v2beta1
MPIJob against its field list (the operator's API reference), and the pod templates inside both
against Kubernetes' PodTemplateSpec schema. Then the job-level facts bluefog needs: the
rendezvous the pods would form is consistent (one worker 0, as many ranks as pods).
"""

import json
import os
import pathlib

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML comes with the test requirements")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is in requirements.txt (make build)")
kf_models = pytest.importorskip(
    "kubeflow.training.models", reason="kubeflow-training is in requirements.txt (make build)")

import jsonschema  # noqa: E402  (kubernetes-validate's dependency)
import referencing  # noqa: E402
from kubernetes_validate.utils import schema_contents  # noqa: E402

from bluefog.common.tf_config import rendezvous_from_tf_config  # noqa: E402

K8S_VERSION = "1.30.0"
HERE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "kubernetes"
MANIFESTS = sorted(HERE.glob("*.yaml"))


def documents(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def k8s_schema_validator(name):
    """A strict validator for one of Kubernetes' definitions (e.g. podtemplatespec-v1)."""
    version = kubernetes_validate.utils.major_minor(K8S_VERSION)
    full = [v for v in kubernetes_validate.utils.all_versions()
            if kubernetes_validate.utils.major_minor(v) <= version][-1]
    folder = f"kubernetes-json-schema/v{full}-local-strict"
    schema = schema_contents(f"{folder}/{name}.json", K8S_VERSION)
    defs = schema_contents(f"{folder}/_definitions.json", K8S_VERSION)
    registry = referencing.Resource.from_contents(defs) @ (
        referencing.Resource.from_contents(schema) @ referencing.Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


POD_TEMPLATE = k8s_schema_validator("podtemplatespec-v1")
OBJECT_META = k8s_schema_validator("objectmeta-meta-v1")
SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def walk(value, type_name, path, errors):
    """Checks value against a generated model type name ('str', 'dict(str, X)', 'list[X]', a
    model class); unknown fields and wrong types become errors naming the path."""
    if type_name in SCALARS:
        if not isinstance(value, SCALARS[type_name]) or (
                type_name == "int" and isinstance(value, bool)):
            errors.append(f"{path}: {value!r} is not {type_name}")
        return
    if type_name.startswith("dict(str, "):
        if not isinstance(value, dict):
            errors.append(f"{path}: not a mapping")
            return
        for key, item in value.items():
            walk(item, type_name[len("dict(str, "):-1], f"{path}.{key}", errors)
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: not a list")
            return
        for i, item in enumerate(value):
            walk(item, type_name[5:-1], f"{path}[{i}]", errors)
        return
    if type_name == "V1PodTemplateSpec":
        errors.extend(f"{path}.{'.'.join(map(str, e.absolute_path))}: {e.message}"
                      for e in POD_TEMPLATE.iter_errors(value))
        return
    if type_name == "V1ObjectMeta":
        errors.extend(f"{path}: {e.message}" for e in OBJECT_META.iter_errors(value))
        return
    model = getattr(kf_models, type_name, None)
    if model is None:
        errors.append(f"{path}: no schema known for type {type_name}")
        return
    walk_fields(value, model.openapi_types, model.attribute_map, path, errors)


def walk_fields(value, types, names, path, errors):
    if not isinstance(value, dict):
        errors.append(f"{path}: not a mapping")
        return
    by_json_name = {names[k]: t for k, t in types.items()}
    for key, item in value.items():
        if key not in by_json_name:
            errors.append(f"{path}: unknown field {key!r} (known: {sorted(by_json_name)})")
        else:
            walk(item, by_json_name[key], f"{path}.{key}", errors)


# The MPI Operator's MPIJob, kubeflow.org/v2beta1 (its API reference: MPIJobSpec and
# ReplicaSpec); runPolicy is the training operator's RunPolicy, which v2beta1 shares.
MPIJOB_V2BETA1_SPEC = {
    "slotsPerWorker": "int", "runPolicy": "KubeflowOrgV1RunPolicy",
    "mpiReplicaSpecs": "dict(str, KubeflowOrgV1ReplicaSpec)", "sshAuthMountPath": "str",
    "launcherCreationPolicy": "str", "mpiImplementation": "str",
}


def validate(doc):
    """Every error of one document against its schema; [] when it is valid."""
    kind, api = doc.get("kind"), doc.get("apiVersion")
    if (kind, api) == ("TFJob", "kubeflow.org/v1"):
        errors = []
        walk(doc, "KubeflowOrgV1TFJob", kind, errors)
        return errors
    if (kind, api) == ("MPIJob", "kubeflow.org/v2beta1"):
        errors = []
        walk_fields(doc, {"a": "str", "k": "str", "m": "V1ObjectMeta", "s": "object"},
                    {"a": "apiVersion", "k": "kind", "m": "metadata", "s": "spec"}, kind, errors)
        spec = doc.get("spec", {})
        walk_fields(spec, MPIJOB_V2BETA1_SPEC, {k: k for k in MPIJOB_V2BETA1_SPEC},
                    f"{kind}.spec", errors)
        if spec.get("mpiImplementation") not in (None, "OpenMPI", "Intel", "MPICH"):
            errors.append(f"{kind}.spec.mpiImplementation: {spec['mpiImplementation']!r}")
        if set(spec.get("mpiReplicaSpecs", {})) - {"Launcher", "Worker"}:
            errors.append(f"{kind}.spec.mpiReplicaSpecs: only Launcher and Worker")
        return errors
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError as e:
        return [f"{kind} {api}: no schema ({e})"]
    except kubernetes_validate.ValidationError as e:
        return [f"{kind}: {e.message} at {'.'.join(map(str, e.path))}"]
    return []


def test_every_example_is_checked():
    assert {p.name for p in MANIFESTS} >= {"mpijob.yaml", "tfjob.yaml", "indexed-job.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_its_schemas(path):
    docs = documents(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        assert validate(doc) == [], f"{path.name}: {doc.get('kind')}"


@pytest.mark.parametrize("broken, expect", [
    (lambda d: d["spec"].update(tfReplicaSpec=d["spec"].pop("tfReplicaSpecs")), "unknown field"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="2"), "is not int"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
     .update(comand=["python"]), "comand"),
])
def test_the_check_catches_mistakes(broken, expect):
    """The walk is strict: a misspelt field or a wrong type in the TFJob is found."""
    doc = documents(HERE / "tfjob.yaml")[0]
    broken(doc)
    errors = validate(doc)
    assert errors and any(expect in e for e in errors), errors


def test_the_core_check_catches_mistakes():
    job = [d for d in documents(HERE / "indexed-job.yaml") if d["kind"] == "Job"][0]
    job["spec"]["completionMode"] = 3
    assert validate(job)


def container_env(container):
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def test_tfjob_forms_one_gloo_job():
    """The TF_CONFIG the training operator gives each worker makes one rendezvous: the port is
    the one the container exposes, only workers exist, every worker agrees on worker 0."""
    doc = documents(HERE / "tfjob.yaml")[0]
    replicas = doc["spec"]["tfReplicaSpecs"]
    assert set(replicas) == {"Worker"}, "bluefog runs workers only (no chief, ps, evaluator)"
    n = replicas["Worker"]["replicas"]
    container = replicas["Worker"]["template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow"
    port = [p["containerPort"] for p in container["ports"] if p["name"] == "tfjob-port"][0]
    name = doc["metadata"]["name"]
    workers = [f"{name}-worker-{i}.default.svc:{port}" for i in range(n)]
    seen = set()
    for i in range(n):
        env = {"TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                        "task": {"type": "worker", "index": i}})}
        rv = rendezvous_from_tf_config(env)
        seen.add((rv["MASTER_ADDR"], rv["MASTER_PORT"], rv["WORLD_SIZE"]))
        assert rv["RANK"] == str(i)
    assert seen == {(f"{name}-worker-0.default.svc", str(port), str(n))}


def test_indexed_job_forms_one_gloo_job():
    docs = {d["kind"]: d for d in documents(HERE / "indexed-job.yaml")}
    job, service = docs["Job"], docs["Service"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"], "every rank must run at once"
    pod = spec["template"]["spec"]
    container = pod["containers"][0]
    env = container_env(container)
    assert env["WORLD_SIZE"] == str(spec["completions"])
    rank = [e for e in container["env"] if e["name"] == "RANK"][0]
    assert "job-completion-index" in rank["valueFrom"]["fieldRef"]["fieldPath"]
    # Pod 0's DNS name under the headless Service is <job>-0.<subdomain>.
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    assert env["MASTER_ADDR"] == f"{job['metadata']['name']}-0.{pod['subdomain']}"
    ports = {p["containerPort"] for p in container["ports"]}
    assert int(env["MASTER_PORT"]) in ports
    assert int(env["MASTER_PORT"]) in {p["port"] for p in service["spec"]["ports"]}


def test_images_build_the_gloo_backend():
    """The image the manifests name (${IMAGE}, built from the Dockerfile: its build stage
    installs Gloo's development files, so the Gloo backend is compiled in; without it
    TF_CONFIG jobs fail at init)."""
    dockerfile = (HERE / "Dockerfile").read_text()
    assert "libgloo-dev" in dockerfile
    for path in MANIFESTS:
        for doc in documents(path):
            text = json.dumps(doc)
            if "image" in text:
                assert '"image": "${IMAGE}"' in text, path.name
    assert os.path.exists(HERE / "Dockerfile")
