"""Argo CD projects/applications and the pipeline WorkflowTemplate: CRD schemas, golden files, rules.

Regenerate golden files after an intended change with ``UPDATE_GOLDEN=1`` and review the diff.
"""
from __future__ import annotations


import pytest
import yaml

from workloads import gitops, pipeline
from tests.support.validation import validate_custom_resource, validate_pod_template
from tests.workloads.golden_files import assert_golden
from tests.support.pipelines import embedded_job

REPO = "https://github.com/example-org/ml-training-platform.git"
NAMESPACES = ("team-research", "team-platform")
DEV = gitops.GitOpsSpec(platform="mlp-dev", repo_url=REPO, target_revision="main",
                        rendered_path="workloads/rendered/dev", namespaces=NAMESPACES,
                        sync_mode=gitops.SyncMode.AUTOMATED)
PROD = gitops.GitOpsSpec(
    platform="mlp-prod", repo_url=REPO, target_revision="main", rendered_path="workloads/rendered/prod",
    namespaces=("team-research",), sync_mode=gitops.SyncMode.MANUAL,
    sync_windows=(gitops.SyncWindowSpec(gitops.WindowKind.ALLOW, "0 9 * * 1-4", "6h", "Europe/Berlin"),),
)

# A PyTorchJob as the training-jobs renderer produces it (trimmed to what the pipeline touches).
TRAIN_JOB = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "gpt2-small", "namespace": "team-research",
                 "labels": {"kueue.x-k8s.io/queue-name": "research", "kueue.x-k8s.io/priority-class": "training-research"}},
    "spec": {
        "nprocPerNode": "1",
        "runPolicy": {"backoffLimit": 20, "cleanPodPolicy": "None", "ttlSecondsAfterFinished": 86400,
                      "activeDeadlineSeconds": 86400},
        "pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": {"spec": {"containers": [{
                "name": "pytorch", "image": "111122223333.dkr.ecr.us-west-2.amazonaws.com/trainer:1",
                "args": ["--nproc-per-node=1", "-m", "trainer", "train", "--config", "/app/trainer/configs/tiny.yaml"],
                "resources": {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}},
            }]}}},
        },
    },
}
PIPELINE = pipeline.PipelineSpec(
    name="gpt2-small-pipeline", namespace="team-research", image="111122223333.dkr.ecr.us-west-2.amazonaws.com/trainer:1",
    train_job=TRAIN_JOB, dataset="/fsx/datasets/raw/shakespeare", model_name="gpt2-small-research",
    job_spec="workloads/declared/dev/jobs/gpt2-small.yaml", fsx_claim="fsx-training-data", tracking_secret="mlflow-tracking",
    cpu_node_selector={"mlplatform.io/pool": "general"},
)


def _golden(name: str, documents: list[dict]) -> None:
    assert_golden(name, yaml.safe_dump_all(documents, sort_keys=True))


CASES = {
    "argocd-dev": lambda: [gitops.bootstrap_project(DEV), *gitops.team_projects(DEV), gitops.root_application(DEV),
                           *(gitops.child_application(DEV, ns) for ns in NAMESPACES)],
    "argocd-prod": lambda: [gitops.bootstrap_project(PROD), *gitops.team_projects(PROD),
                            gitops.root_application(PROD), gitops.child_application(PROD, "team-research")],
    "workflowtemplate-pipeline": lambda: [pipeline.workflow_template(PIPELINE)],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    _golden(case, CASES[case]())


@pytest.mark.parametrize("case", sorted(CASES))
def test_against_crds(case, schemas):
    for doc in CASES[case]():
        assert validate_custom_resource(doc, schemas) == [], doc["metadata"]["name"]


def test_validation_catches_a_wrong_field(schemas):
    app = gitops.root_application(DEV)
    app["spec"]["syncPolicy"]["automated"]["selfheal"] = True  # wrong case: the API server would drop it
    assert any("selfheal" in e for e in validate_custom_resource(app, schemas))


def test_train_fixture_is_a_valid_pytorchjob(schemas):
    assert validate_custom_resource(TRAIN_JOB, schemas) == []


def test_embedded_train_job_is_valid_and_carries_the_pipeline_paths(schemas):
    template = pipeline.workflow_template(PIPELINE)
    job = embedded_job(template)
    assert validate_custom_resource(job, schemas) == []
    assert job["metadata"]["name"] == "{{workflow.name}}-train"
    args = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    # The job's own arguments first, then the pipeline's settings.
    assert args[:6] == TRAIN_JOB["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"]
    work = "/fsx/checkpoints/team-research/pipelines/{{workflow.name}}"
    assert f"data.dir={work}/tokens" in args
    assert f"checkpoint.dir={work}/checkpoints" in args
    # The renderer's object is not mutated.
    assert "data.dir" not in " ".join(TRAIN_JOB["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["args"])


def test_pod_templates_validate_against_kubernetes_1_32():
    pods = pipeline.pod_templates(pipeline.workflow_template(PIPELINE))
    assert [name for name, _ in pods] == ["prepare", "evaluate", "register"]
    for name, pod in pods:
        assert validate_pod_template(pod) == [], name


def test_pod_template_validation_can_fail():
    _, pod = pipeline.pod_templates(pipeline.workflow_template(PIPELINE))[0]
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = {"bad": 1}
    assert validate_pod_template(pod) != []


def test_steps_run_in_order_with_the_shared_commands():
    template = pipeline.workflow_template(PIPELINE)
    main = next(t for t in template["spec"]["templates"] if t["name"] == "pipeline")
    assert [group[0]["name"] for group in main["steps"]] == list(pipeline.STEP_NAMES)
    by_name = {t["name"]: t for t in template["spec"]["templates"]}
    commands = pipeline.cluster_commands(PIPELINE)
    for step in ("prepare", "evaluate", "register"):
        container = by_name[step]["container"]
        assert container["command"] + container["args"] == commands[step]
        assert by_name[step]["nodeSelector"] == {"mlplatform.io/pool": "general"}
    assert commands["prepare"][:4] == ["python", "-m", "trainer", "prepare-data"]
    assert {p["name"] for p in template["spec"]["arguments"]["parameters"]} == set(pipeline.WORKFLOW_PARAMS)


def test_only_the_train_step_retries_and_only_on_executor_errors():
    template = pipeline.workflow_template(PIPELINE)
    retrying = {t["name"]: t["retryStrategy"] for t in template["spec"]["templates"] if "retryStrategy" in t}
    assert list(retrying) == ["train"]
    # tests/workloads/test_pipeline_conditions.py: a failed job is final, a lost executor re-attaches.
    assert retrying["train"]["retryPolicy"] == "OnError"
    assert retrying["train"]["limit"] == PIPELINE.train_retry_limit
    train = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    # apply re-attaches a retried step to the job already running; create would fail with AlreadyExists.
    assert train["resource"]["action"] == "apply"
    assert train["activeDeadlineSeconds"] == 86400 + pipeline.TRAIN_DEADLINE_MARGIN_SECONDS


def test_projects_admit_only_this_repository_the_team_namespaces_and_rendered_kinds():
    projects = gitops.team_projects(DEV)
    assert len(projects) == len(NAMESPACES)
    for project in projects:
        # One destination: the team's own namespace, never another team's.
        assert project["spec"]["destinations"] == [{"server": gitops.IN_CLUSTER,
                                                    "namespace": project["metadata"]["labels"]["mlplatform.io/namespace"]}]
    project = projects[0]
    assert project["spec"]["sourceRepos"] == [REPO]
    assert project["spec"]["clusterResourceWhitelist"] == []
    assert {(k["group"], k["kind"]) for k in project["spec"]["namespaceResourceWhitelist"]} == set(gitops.MANAGED_KINDS)
    boot = gitops.bootstrap_project(DEV)
    assert boot["spec"]["namespaceResourceWhitelist"] == [{"group": "argoproj.io", "kind": "Application"}]
    assert boot["spec"]["destinations"] == [{"server": gitops.IN_CLUSTER, "namespace": "argocd"}]


def test_sync_policy_dev_automated_prod_manual_with_windows():
    dev = gitops.root_application(DEV)["spec"]["syncPolicy"]
    assert dev["automated"] == {"enabled": True, "prune": True, "selfHeal": True, "allowEmpty": False}
    prod = gitops.child_application(PROD, "team-research")["spec"]["syncPolicy"]
    assert "automated" not in prod
    windows = gitops.team_projects(PROD)[0]["spec"]["syncWindows"]
    assert windows == [{"kind": "allow", "schedule": "0 9 * * 1-4", "duration": "6h", "timeZone": "Europe/Berlin",
                        "manualSync": True, "applications": ["*"]}]


def test_children_ignore_the_fields_kueue_mutates():
    app = gitops.child_application(DEV, "team-research")
    pointers = {(d["kind"], p) for d in app["spec"]["ignoreDifferences"] for p in d["jsonPointers"]}
    assert ("PyTorchJob", "/spec/runPolicy/suspend") in pointers
    assert "RespectIgnoreDifferences=true" in app["spec"]["syncPolicy"]["syncOptions"]


def test_child_for_an_unknown_namespace_is_refused():
    with pytest.raises(ValueError, match="team-unknown"):
        gitops.child_application(DEV, "team-unknown")


# A job as the renderer writes it: its own data.dir and run name in the arguments, and the
# environment the trainer also reads (trainer/config.py maps TRAINER_CHECKPOINT_DIR ->
# checkpoint.dir, TRAINER_RUN_ID -> tracking.job_id, TRAINER_CHECKPOINT_S3_URI -> checkpoint.s3_uri).
_CONTAINER = TRAIN_JOB["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
RENDERED_JOB = {**TRAIN_JOB, "spec": {**TRAIN_JOB["spec"], "pytorchReplicaSpecs": {"Master": {
    **TRAIN_JOB["spec"]["pytorchReplicaSpecs"]["Master"], "template": {"spec": {"containers": [{
        **_CONTAINER,
        "args": [*_CONTAINER["args"], "data.dir=/fsx/datasets/tokens/shakespeare", "tracking.run_name=mine", "optim.lr=3e-4"],
        "env": [{"name": "TRAINER_CHECKPOINT_DIR", "value": "/fsx/checkpoints/team-research/gpt2-small"},
                {"name": "TRAINER_RUN_ID", "value": "team-research.gpt2-small"},
                {"name": "TRAINER_CHECKPOINT_S3_URI", "value": "s3://ckpt/team-research/mirror/gpt2-small"}],
    }]}}}}}}


def test_the_train_manifest_says_each_setting_once_and_env_agrees_with_arguments():
    """The trainer applies overrides in order (last wins) and reads TRAINER_* variables; the
    pipeline's job must not carry the job spec's value next to its own."""
    from dataclasses import replace

    job = pipeline.train_job(replace(PIPELINE, train_job=RENDERED_JOB))
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    settings = [a.split("=", 1)[0] for a in container["args"] if "=" in a and not a.startswith("-")]
    assert len(settings) == len(set(settings)), settings
    args = dict(a.split("=", 1) for a in container["args"] if "=" in a and not a.startswith("-"))
    env = {e["name"]: e["value"] for e in container["env"]}
    assert args["optim.lr"] == "3e-4"  # the job spec's own settings stay
    assert env["TRAINER_CHECKPOINT_DIR"] == args["checkpoint.dir"]
    assert env["TRAINER_RUN_ID"] == args["tracking.job_id"] == "{{workflow.name}}"
    assert args["data.dir"] == f"{pipeline.team_work_root('team-research')}/{{{{workflow.name}}}}/tokens"
    assert env["TRAINER_CHECKPOINT_S3_URI"] == "s3://ckpt/team-research/mirror/{{workflow.name}}"


def test_pipeline_runs_write_inside_the_teams_own_directory():
    """FSx, "POSIX metadata support for data repositories": directories FSx creates for a data
    repository association belong to root (0755), and root squash stops a root pod from chowning
    them. The only directory a team's uid owns is its checkpoint directory, imported from an S3
    directory object whose metadata names the team's uid (components.training). A pipeline run
    must write inside it: anywhere else its pods get EACCES (and, with the subtree mount, they
    do not even see the rest of the file system)."""
    from workloads import fsx, trainingjob

    root = trainingjob.team_checkpoint_root("team-research")
    # The pods' writable mount is exactly that directory.
    mounts = {m["mountPath"]: m for m in fsx.team_volume_mounts("team-research")}
    assert root in mounts and not mounts[root].get("readOnly")
    work = pipeline.cluster_paths(PIPELINE).work_dir
    assert work.startswith(root + "/")
    for path in (pipeline.cluster_paths(PIPELINE).tokens, pipeline.cluster_paths(PIPELINE).checkpoints):
        assert path.startswith(work + "/")
    # Another team's pipeline lands in its own tree.
    assert pipeline.team_work_root("team-platform").startswith(trainingjob.team_checkpoint_root("team-platform") + "/")


def test_the_steps_that_read_the_checkpoint_have_the_teams_key_and_only_they():
    """evaluate and register load the train step's checkpoint, whose manifest the trainer signed
    with the team's key; in a pod the trainer refuses to read a checkpoint without it
    (trainer/trust.py `read_key`), so without the mount both steps exit 2."""
    from workloads.trainingjob import CHECKPOINT_KEY_MOUNT, CHECKPOINT_KEY_SECRET

    template = pipeline.workflow_template(PIPELINE)
    secret = next(v for v in template["spec"]["volumes"] if v["name"] == "checkpoint-key")
    assert secret["secret"]["secretName"] == CHECKPOINT_KEY_SECRET
    steps = {t["name"]: t["container"] for t in template["spec"]["templates"] if "container" in t}
    for name, container in steps.items():
        has_key = {"name": "TRAINER_CHECKPOINT_KEY_FILE", "value": f"{CHECKPOINT_KEY_MOUNT}/key"} in container.get("env", [])
        mounted = {"name": "checkpoint-key", "mountPath": CHECKPOINT_KEY_MOUNT, "readOnly": True} in container["volumeMounts"]
        assert has_key == mounted == (name in ("evaluate", "register")), name
