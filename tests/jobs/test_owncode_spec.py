"""Own code in the job spec (`command` / `script` + `args`, `code`) and in the rendered job: the
platform's launcher and torchrun options stay, only what torchrun runs is the user's; the pinned
archive reaches the pod as env + an emptyDir; objects valid against the pinned upstream CRDs."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from workloads.jobspec import JobSpecError, parse_job_spec
from workloads.trainingjob import LAUNCH_COMMAND, render
from tests.support.validation import validate_custom_resource, validate_pod_template

SHA = "ab" * 32
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/trainer:1.0.0"


@pytest.fixture(scope="module")
def dev_facts(dev_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(dev_plan)


def _raw(**extra):
    raw = {"name": "own-ddp", "team": "research", "image": IMAGE, "gpuType": "a10g", "nodes": 2, "gpusPerNode": 4,
           "dataset": "/fsx/datasets/tinystories/gpt2-v1", **extra}
    return {k: v for k, v in raw.items() if v is not None}


def _code(facts, sha=SHA):
    return {"uri": f"s3://{facts.checkpoints_bucket}/team-research/code/own-ddp/{sha}.tar.gz", "sha256": sha}


def _container(job):
    return job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]


def test_script_runs_under_the_platform_launcher_with_its_archive(dev_facts, schemas):
    job = render(parse_job_spec(_raw(script="train.py", args=["--lr", "$(SECRET)"], code=_code(dev_facts))), dev_facts)
    assert validate_custom_resource(job, schemas) == []
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert validate_pod_template(replica["template"]) == []
    container = _container(job)
    assert container["command"] == list(LAUNCH_COMMAND)
    # torchrun's rendezvous and shutdown timeout are the platform's; then the script, args literal.
    assert container["args"][:5] == ["--nnodes=$(PET_NNODES)", "--nproc-per-node=$(PET_NPROC_PER_NODE)",
                                     "--node-rank=$(PET_NODE_RANK)", "--master-addr=$(PET_MASTER_ADDR)",
                                     "--master-port=$(PET_MASTER_PORT)"]
    assert "--max-restarts=0" in container["args"] and any(a.startswith("--shutdown-timeout=") for a in container["args"])
    assert container["args"][-3:] == ["train.py", "--lr", "$$(SECRET)"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MLP_CODE_URI"] == _code(dev_facts)["uri"] and env["MLP_CODE_SHA256"] == SHA
    assert env["MLP_CODE_DIR"] == "/opt/mlplatform/code" and env["MLP_DATASET_DIR"] == "/fsx/datasets/tinystories/gpt2-v1"
    assert env["TRAINER_CHECKPOINT_DIR"].endswith("/team-research/own-ddp") and "MLFLOW_TRACKING_URI" in env
    pod = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert {"name": "code", "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    assert {"name": "code", "mountPath": "/opt/mlplatform/code"} in container["volumeMounts"]


def test_command_forms_become_torchrun_targets(dev_facts):
    module = _container(render(parse_job_spec(_raw(command=["python", "-m", "mypkg.train", "--x", "1"])), dev_facts))
    assert module["args"][-4:] == ["-m", "mypkg.train", "--x", "1"]
    binary = _container(render(parse_job_spec(_raw(command=["./run.sh", "fast"])), dev_facts))
    assert binary["args"][-3:] == ["--no-python", "./run.sh", "fast"]
    # From the image (no archive): nothing to fetch, no extra volume.
    assert not any(e["name"].startswith("MLP_CODE") for e in module["env"])
    assert all(m["name"] != "code" for m in module["volumeMounts"])


def test_trainjob_carries_the_same_own_code_pod(dev_facts, schemas):
    facts = dataclasses.replace(dev_facts, trainer_v2_runtime="torch-distributed")
    job = render(parse_job_spec(_raw(script="train.py", code=_code(dev_facts), runtime="trainjob")), facts)
    assert validate_custom_resource(job, schemas) == []
    assert job["spec"]["trainer"]["args"][-1] == "train.py"
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert {"name": "code", "mountPath": "/opt/mlplatform/code"} in patch["template"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]


def test_every_own_code_mistake_at_once_with_field_and_fix():
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(_raw(trainer={"config": "trainer/configs/tiny.yaml"}, script="/abs/train.sh",
                            command=["torchrun", "--nproc-per-node=8", "train.py"],
                            code={"uri": "https://example.com/x.tar.gz", "sha256": "nothex"}))
    by_path = {p.path: p for p in err.value.problems}
    assert set(by_path) >= {"script", "command", "code.uri", "code.sha256", "trainer/command/script", "code"}
    assert "platform's launcher runs torchrun itself" in by_path["command"].message
    assert "train.py" in by_path["command"].fix and "submit --code DIR" in by_path["code.sha256"].fix


def test_args_need_a_script_and_python_needs_a_target():
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(_raw(command=["python"], args=["--lr", "1"]))
    by_path = {p.path: p for p in err.value.problems}
    assert "script" in by_path["args"].fix and "without a script or module" in by_path["command"].message
    with pytest.raises(JobSpecError) as err:
        parse_job_spec(_raw())
    assert [p.path for p in err.value.problems] == ["trainer/command/script"]


def test_an_archive_outside_the_teams_code_prefix_is_refused(dev_facts):
    other = {"uri": f"s3://{dev_facts.checkpoints_bucket}/team-platform/code/own-ddp/{SHA}.tar.gz", "sha256": SHA}
    with pytest.raises(JobSpecError) as err:
        render(parse_job_spec(_raw(script="train.py", code=other)), dev_facts)
    [problem] = [p for p in err.value.problems if p.path == "code.uri"]
    assert "outside the job's code prefix" in problem.message and "submit --code DIR" in problem.fix


@pytest.mark.parametrize("example", ["ddp", "hf-trainer"])
def test_shipped_own_code_examples_render_valid_with_their_pinned_archive(example, dev_facts, schemas):
    import yaml

    from jobs import usercode

    root = Path(__file__).resolve().parents[2] / "examples" / "own-code"
    spec = parse_job_spec(yaml.safe_load((root / f"{example}.yaml").read_text()))
    code = usercode.archive(root / example)
    assert code.files == ("train.py",)
    job = render(usercode.pin(spec, code, dev_facts.checkpoints_bucket, dev_facts.stack), dev_facts)
    assert validate_custom_resource(job, schemas) == []
    env = {e["name"]: e.get("value") for e in _container(job)["env"]}
    assert env["MLP_CODE_SHA256"] == code.sha256 and env["MLP_CODE_URI"].endswith(f"/{code.sha256}.tar.gz")


def test_a_pipeline_refuses_a_job_spec_that_runs_own_code(dev_facts):
    """The pipeline appends trainer overrides to the train step and evaluates the trainer's
    checkpoints: an own-code job would get them as script arguments."""
    from workloads import pipeline

    job = render(parse_job_spec(_raw(script="train.py")), dev_facts)
    declaration = pipeline.parse_declaration({"name": "p", "jobSpec": "examples/own-code/ddp.yaml",
                                              "dataset": "/fsx/datasets/x", "modelName": "m"}, source="p.yaml")
    with pytest.raises(ValueError, match="runs your own code .* Fix: submit it as a job"):
        pipeline.pipeline_spec(declaration, job, fsx_claim="c", tracking_secret="s", cpu_node_selector={})
