"""The training pipeline as an Argo WorkflowTemplate: prepare data -> train -> evaluate -> register.

Pure functions (spec in, dict out). The commands of every step come from ``step_commands``, the
same function ``python -m workloads pipeline --local`` runs on CPU, so the local run proves the
commands the cluster will run.

- prepare: ``python -m trainer prepare-data`` on the CPU pool, tokens written to FSx.
- train: the PyTorchJob from the training-jobs renderer, applied by a resource step that waits
  for the job's terminal condition (see "The train step's conditions" below).
- evaluate: validation loss of the final checkpoint, written as JSON (an output parameter).
- register: ``python -m trainer export`` of exactly the checkpoint evaluate scored: a Hugging Face
  model logged to the training run (its lineage tags, and the pipeline's that evaluate set on the
  run) and registered as a new version in the MLflow Model Registry.

Checked against Argo Workflows v4.1.2 (workflow/executor/resource.go): resource conditions are
parsed by ``labels.Parse``, so every key is a Kubernetes qualified name (a plain dotted path, no
gjson query such as ``#(type==Failed)``), and each key is read from the job's JSON with
``gjson.Get``. ``matchConditions`` tests the failure requirements first and *each on its own*
(any one that matches fails the step, and that failure is not retried by the executor), then
needs *all* success requirements.

The train step's conditions (Training Operator v1.9.4):
- A job is over when the operator has written a terminal condition. It appends a condition at
  the end of ``status.conditions`` after removing the one of the same type, and writes nothing
  once a ``Failed`` condition exists (pkg/util/status.go ``setCondition``/``filterOutCondition``).
  A job has at most one condition of each of the six types (Created, Running, Restarting,
  Succeeded, Suspended, Failed), so "Failed at position 0, or 1, ... or 5" is "the job failed",
  whichever reason the operator gave (a permanent exit code, the backoff limit, the deadline).
- Success is ``completionTime`` set (the operator sets it with the Succeeded condition, and on
  the backoff/deadline failures, which the failure condition catches first) with the Master
  replica succeeded.
- Not ``replicaStatuses.Master.failed``: the operator counts a Running pod that has a
  deletionTimestamp as failed (pkg/core/status.go), so a drained or preempted Master is
  "failed" for its whole grace period while the job restarts it in place (restartPolicy
  ExitCode, exit codes 128-255). A preemption is not a pipeline failure.
- The step retries only executor errors (its pod lost with a CPU node, an API-server error):
  ``action: apply`` re-attaches to the job already running. A job that runs past its deadline is
  bounded by the step's ``activeDeadlineSeconds``.

Where a run's files live: ``team_work_root`` (one function, so the path and its ownership
change together).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import yaml

from trainer.contract.environment import ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_KEY_FILE, ENV_RUN_ID
from workloads.fsx import team_pod_volumes, team_volume_mounts
from workloads.trainingjob import (CHECKPOINT_KEY_ITEM, CHECKPOINT_KEY_MOUNT, CHECKPOINT_KEY_SECRET, TRAINER_UID,
                                   pod_security_context, team_checkpoint_root)

WORKFLOW_PARAMS = ("dataset", "model-name", "job-spec")
STEP_NAMES = ("prepare", "train", "evaluate", "register")
# kubeflow.org/v1 JobConditionType (pkg/apis/kubeflow.org/v1/common_types.go): the operator keeps
# at most one condition per type, so a condition sits at one of these many positions.
JOB_CONDITION_TYPES = ("Created", "Running", "Restarting", "Succeeded", "Suspended", "Failed")
# Label selectors Argo evaluates on the job's JSON (see the module docstring): failure is any one
# requirement, success is all of them.
TRAIN_FAILURE_CONDITION = ",".join(f"status.conditions.{i}.type==Failed" for i in range(len(JOB_CONDITION_TYPES)))
TRAIN_SUCCESS_CONDITION = "status.completionTime,status.replicaStatuses.Master.succeeded>0"
# Executor errors only: a Failed step is a failed job, final.
TRAIN_RETRY_POLICY = "OnError"
# Time after the job's own deadline before the train step gives up on it.
TRAIN_DEADLINE_MARGIN_SECONDS = 15 * 60


@dataclass(frozen=True)
class StepPaths:
    """Where one run's files live (on FSx in the cluster, in a temp dir locally)."""

    work_dir: str

    @property
    def tokens(self) -> str:
        return f"{self.work_dir}/tokens"

    @property
    def checkpoints(self) -> str:
        return f"{self.work_dir}/checkpoints"

    @property
    def evaluation(self) -> str:
        return f"{self.work_dir}/evaluation.json"

    @property
    def final_checkpoint_file(self) -> str:
        return f"{self.work_dir}/final-checkpoint"

    @property
    def export_dir(self) -> str:
        return f"{self.work_dir}/model"


def train_overrides(paths: StepPaths, run_name: str) -> list[str]:
    """Trainer overrides the pipeline adds after the job's own (the last value of a key wins): its
    data, its checkpoints, and its own MLflow run: ``tracking.job_id`` is the run's identity, and
    the job spec's would make every pipeline run resume the same MLflow run. The register step
    exports the checkpoint evaluate scored, so the trainer's own end-of-run export is off."""
    return [f"data.dir={paths.tokens}", f"checkpoint.dir={paths.checkpoints}", f"tracking.job_id={run_name}",
            f"tracking.run_name={run_name}", "export.at_end=false"]


def step_commands(*, paths: StepPaths, dataset: str, model_name: str, run_name: str, pipeline: str,
                  job_spec: str, final_checkpoint: str, python: str = "python") -> dict[str, list[str]]:
    """The command of every container step (train runs inside the PyTorchJob: see ``train_job``).

    ``final_checkpoint`` is what evaluate wrote to ``paths.final_checkpoint_file``: an Argo output
    parameter in the cluster, the file's content locally.
    """
    lineage = [f"mlplatform.pipeline={pipeline}", f"mlplatform.pipeline.run={run_name}",
               f"mlplatform.job_spec={job_spec}", f"mlplatform.dataset={dataset}"]
    return {
        "prepare": [python, "-m", "trainer", "prepare-data", "--input", dataset, "--output-dir", paths.tokens],
        "evaluate": [python, "-m", "trainer.evaluate", "--checkpoint-dir", paths.checkpoints,
                     "--data-dir", paths.tokens, "--output", paths.evaluation,
                     "--final-checkpoint-file", paths.final_checkpoint_file,
                     *[arg for tag in lineage for arg in ("--tag", tag)]],
        # Export (Hugging Face format) of the evaluated checkpoint, logged to the training run
        # and registered as a new version of the model (trainer/export.py).
        "register": [python, "-m", "trainer", "export", "--checkpoint", final_checkpoint,
                     "--out", paths.export_dir, "--registered-model-name", model_name],
    }


@dataclass(frozen=True)
class PipelineSpec:
    """One team's pipeline.

    name: WorkflowTemplate name.
    namespace: the team namespace it runs in.
    image: the trainer image (digest-pinned in prod) for the container steps.
    train_job: the PyTorchJob the training-jobs renderer produced for ``job_spec``.
    dataset: default of the ``dataset`` parameter: raw text files (directory or glob) on FSx.
    model_name: default of the ``model-name`` parameter (MLflow registered model).
    job_spec: repository path of the job spec (default of ``job-spec``, recorded as lineage).
    fsx_claim: the team namespace's FSx PersistentVolumeClaim.
    tracking_secret: Secret with MLFLOW_TRACKING_URI/USERNAME/PASSWORD of the team's MLflow user.
    cpu_node_selector / cpu_tolerations: the Karpenter CPU pool.
    service_account: the namespace's workflow service account (Pulumi creates it and its Role).
    train_retry_limit: re-attaches of the train step after an executor error (its pod lost, an
        API-server error); a failed job is never retried by the pipeline.
    active_deadline_seconds: the whole workflow's limit (the job's own plus prepare/evaluate).
    """

    name: str
    namespace: str
    image: str
    train_job: Mapping[str, Any]
    dataset: str
    model_name: str
    job_spec: str
    fsx_claim: str
    fsx_mount_path: str = "/fsx"
    tracking_secret: Optional[str] = None
    cpu_node_selector: Mapping[str, str] = field(default_factory=dict)
    cpu_tolerations: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    # The team's uid/gid: what the train job's pods run as.
    uid: int = TRAINER_UID
    service_account: str = "pipeline-runner"
    train_retry_limit: int = 2
    active_deadline_seconds: int = 7 * 24 * 3600
    cpu_request: str = "2"
    memory_request: str = "8Gi"

    @property
    def work_root(self) -> str:
        return team_work_root(self.namespace)


RUN = "{{workflow.name}}"


def team_work_root(namespace: str) -> str:
    """Where a team's pipeline runs keep their files (one directory per run below it).

    Inside the team's checkpoint directory, which the platform creates owned by the team's uid
    (an S3 directory object with POSIX metadata, imported by the association): FSx creates the directories of a data repository
    association, and its root, owned by root 0755, so a directory the trainer's uid creates at
    the FSx root (the old ``/fsx/pipelines``) fails with EACCES. Being under the team's tree, a
    run's checkpoints and exported model also reach the team's prefix of the checkpoints bucket,
    and a mount of the team's subtree covers them. Change the path and its ownership here only.
    """
    return f"{team_checkpoint_root(namespace)}/pipelines"


def _param(name: str) -> str:
    return "{{workflow.parameters.%s}}" % name


def cluster_paths(spec: PipelineSpec) -> StepPaths:
    return StepPaths(f"{spec.work_root.rstrip('/')}/{RUN}")


def cluster_commands(spec: PipelineSpec) -> dict[str, list[str]]:
    return step_commands(paths=cluster_paths(spec), dataset=_param("dataset"), model_name=_param("model-name"),
                         run_name=RUN, pipeline=spec.name, job_spec=_param("job-spec"),
                         final_checkpoint="{{steps.evaluate.outputs.parameters.checkpoint}}")


def _trainer_container(job: Mapping[str, Any], replica: str) -> dict[str, Any]:
    spec = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]
    containers = [c for c in spec["containers"] if c["name"] == "pytorch"]
    if not containers:
        raise ValueError(f"PyTorchJob {job['metadata'].get('name')}: {replica} has no 'pytorch' container")
    return containers[0]


def _override_key(arg: str) -> Optional[str]:
    key, equals, _ = arg.partition("=")
    return key if equals and not arg.startswith("-") else None


def train_job(spec: PipelineSpec) -> dict[str, Any]:
    """The rendered PyTorchJob, renamed per workflow run, pointed at the run's files.

    One value per setting: the job spec's values of the keys the pipeline sets are replaced
    (not shadowed by a later override), and the environment the trainer also reads
    (trainer/config.py: TRAINER_CHECKPOINT_DIR, TRAINER_RUN_ID, TRAINER_CHECKPOINT_S3_URI) says
    the same as the arguments.
    """
    if spec.train_job.get("kind") != "PyTorchJob":
        raise ValueError(f"pipeline {spec.name}: train_job must be a PyTorchJob, got {spec.train_job.get('kind')!r}")
    job = copy.deepcopy(dict(spec.train_job))
    job["metadata"] = {**job["metadata"], "name": f"{RUN}-train", "namespace": spec.namespace}
    job["metadata"]["labels"] = {**job["metadata"].get("labels", {}), "mlplatform.io/pipeline": spec.name}
    paths = cluster_paths(spec)
    extra = train_overrides(paths, RUN)
    replaced = {_override_key(arg) for arg in extra}
    env_values = {ENV_CHECKPOINT_DIR: paths.checkpoints, ENV_RUN_ID: RUN}
    for replica in job["spec"]["pytorchReplicaSpecs"]:
        container = _trainer_container(job, replica)
        container["args"] = [a for a in container.get("args", []) if _override_key(a) not in replaced] + extra
        for variable in container.get("env", []):
            if variable["name"] in env_values:
                variable["value"] = env_values[variable["name"]]
            elif variable["name"] == "TRAINER_CHECKPOINT_S3_URI":
                # The job's mirror prefix ends in its name: the run's ends in the run's.
                variable["value"] = f"{variable['value'].rsplit('/', 1)[0]}/{RUN}"
    return job


def job_deadline_seconds(job: Mapping[str, Any]) -> int:
    return int(job["spec"].get("runPolicy", {}).get("activeDeadlineSeconds") or 7 * 24 * 3600)


def _container_step(spec: PipelineSpec, name: str, command: list[str], *, outputs: Optional[dict] = None,
                    reads_checkpoints: bool = False) -> dict[str, Any]:
    env_from = [{"secretRef": {"name": spec.tracking_secret}}] if spec.tracking_secret else []
    env, key_mounts = [], []
    if reads_checkpoints:
        # evaluate and register load the train step's checkpoint: its manifest is signed with the
        # team's key, and in a pod the trainer refuses to read one without it (trainer/trust.py).
        env = [{"name": ENV_CHECKPOINT_KEY_FILE, "value": f"{CHECKPOINT_KEY_MOUNT}/{CHECKPOINT_KEY_ITEM}"}]
        key_mounts = [{"name": "checkpoint-key", "mountPath": CHECKPOINT_KEY_MOUNT, "readOnly": True}]
    template: dict[str, Any] = {
        "name": name,
        # The CPU pool consolidates under-used nodes; a half-done tokenisation would start over.
        "metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}},
        "nodeSelector": dict(spec.cpu_node_selector),
        "tolerations": [dict(t) for t in spec.cpu_tolerations],
        "container": {
            "name": "main",
            "image": spec.image,
            "command": command[:1],
            "args": command[1:],
            "envFrom": env_from,
            **({"env": env} if env else {}),
            "resources": {"requests": {"cpu": spec.cpu_request, "memory": spec.memory_request},
                          "limits": {"memory": spec.memory_request}},
            # The team's subtree and the datasets, as the training job mounts them (workloads.fsx).
            "volumeMounts": team_volume_mounts(spec.namespace) + key_mounts,
            "securityContext": {"runAsNonRoot": True, "runAsUser": spec.uid, "runAsGroup": spec.uid,
                                "allowPrivilegeEscalation": False,
                                "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
        },
    }
    if outputs:
        template["outputs"] = outputs
    return template


def workflow_template(spec: PipelineSpec) -> dict[str, Any]:
    commands = cluster_commands(spec)
    paths = cluster_paths(spec)
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTemplate",
        "metadata": {"name": spec.name, "namespace": spec.namespace,
                     "labels": {"mlplatform.io/pipeline": spec.name}},
        "spec": {
            "entrypoint": "pipeline",
            "serviceAccountName": spec.service_account,
            "activeDeadlineSeconds": spec.active_deadline_seconds,
            "arguments": {"parameters": [
                {"name": "dataset", "value": spec.dataset, "description": "raw text files (directory or glob) on FSx"},
                {"name": "model-name", "value": spec.model_name, "description": "MLflow registered model name"},
                {"name": "job-spec", "value": spec.job_spec, "description": "job spec the train step was rendered from"},
            ]},
            "volumes": team_pod_volumes(claim_name=spec.fsx_claim) + [
                {"name": "checkpoint-key", "secret": {"secretName": CHECKPOINT_KEY_SECRET, "items": [
                    {"key": CHECKPOINT_KEY_ITEM, "path": CHECKPOINT_KEY_ITEM}]}}],
            # The team's uid/gid (the team admission policy refuses any other), from the train job.
            "securityContext": pod_security_context(spec.uid),
            "podGC": {"strategy": "OnWorkflowSuccess"},
            "ttlStrategy": {"secondsAfterSuccess": 7 * 24 * 3600, "secondsAfterFailure": 14 * 24 * 3600},
            "templates": [
                {"name": "pipeline", "steps": [
                    [{"name": "prepare", "template": "prepare"}],
                    [{"name": "train", "template": "train"}],
                    [{"name": "evaluate", "template": "evaluate"}],
                    [{"name": "register", "template": "register"}],
                ]},
                _container_step(spec, "prepare", commands["prepare"]),
                {
                    "name": "train",
                    "activeDeadlineSeconds": job_deadline_seconds(spec.train_job) + TRAIN_DEADLINE_MARGIN_SECONDS,
                    "retryStrategy": {"limit": spec.train_retry_limit, "retryPolicy": TRAIN_RETRY_POLICY,
                                      "backoff": {"duration": "30s"}},
                    "resource": {
                        # apply, not create: a retried step re-attaches to the job it already started.
                        "action": "apply",
                        "setOwnerReference": True,
                        "successCondition": TRAIN_SUCCESS_CONDITION,
                        "failureCondition": TRAIN_FAILURE_CONDITION,
                        "manifest": yaml.safe_dump(train_job(spec), sort_keys=True),
                    },
                },
                _container_step(spec, "evaluate", commands["evaluate"], reads_checkpoints=True, outputs={"parameters": [
                    {"name": "evaluation", "valueFrom": {"path": paths.evaluation}},
                    {"name": "checkpoint", "valueFrom": {"path": paths.final_checkpoint_file}}]}),
                _container_step(spec, "register", commands["register"], reads_checkpoints=True),
            ],
        },
    }


def pod_templates(template: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Each container step as the pod template Argo would create (for Kubernetes 1.32 validation)."""
    volumes = template["spec"].get("volumes", [])
    out = []
    for step in template["spec"]["templates"]:
        if "container" not in step:
            continue
        pod_spec = {"containers": [step["container"]], "volumes": volumes, "restartPolicy": "Never",
                    "serviceAccountName": template["spec"]["serviceAccountName"]}
        for key in ("nodeSelector", "tolerations"):
            if step.get(key):
                pod_spec[key] = step[key]
        metadata = {"labels": {"step": step["name"]}, **step.get("metadata", {})}
        out.append((step["name"], {"metadata": metadata, "spec": pod_spec}))
    return out


# -- declarations (workloads/declared/<stack>/pipelines/*.yaml) -------------------------------
@dataclass(frozen=True)
class PipelineDeclaration:
    """What a team commits: the pipeline's name, the job spec its train step runs, the defaults
    of its parameters. Namespace and image come from the job spec."""

    name: str
    job_spec: str
    dataset: str
    model_name: str
    train_retry_limit: int = 2


_DNS_LABEL = r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$"
_DECLARATION_KEYS = {"name": "name", "jobSpec": "job_spec", "dataset": "dataset", "modelName": "model_name",
                     "trainRetryLimit": "train_retry_limit"}


def parse_declaration(raw: Any, *, source: str) -> PipelineDeclaration:
    """A pipeline declaration, or ValueError listing every problem (field, value, fix)."""
    import re

    if not isinstance(raw, dict):
        raise ValueError(f"{source}: must be a YAML mapping with keys {sorted(_DECLARATION_KEYS)}")
    problems = []
    for key in raw:
        if key not in _DECLARATION_KEYS:
            problems.append(f"{key}: unknown key (got {raw[key]!r}). Fix: use one of {sorted(_DECLARATION_KEYS)}")
    for key in ("name", "jobSpec", "dataset", "modelName"):
        if not isinstance(raw.get(key), str) or not raw.get(key):
            problems.append(f"{key}: required string (got {raw.get(key)!r}). Fix: add `{key}: ...`")
    if isinstance(raw.get("name"), str) and not re.match(_DNS_LABEL, raw["name"]):
        problems.append(f"name: not a DNS label (got {raw['name']!r}). Fix: lowercase letters, digits and '-'")
    if isinstance(raw.get("dataset"), str) and not raw["dataset"].startswith("/fsx/"):
        problems.append(f"dataset: must be on the FSx mount (got {raw['dataset']!r}). Fix: a path under /fsx/")
    retries = raw.get("trainRetryLimit", 2)
    if not isinstance(retries, int) or isinstance(retries, bool) or not 0 <= retries <= 10:
        problems.append(f"trainRetryLimit: must be an integer 0-10 (got {retries!r}). Fix: e.g. 2")
    if problems:
        raise ValueError(f"{source}: {len(problems)} problem{'s' if len(problems) != 1 else ''}\n"
                         + "\n".join(f"  - {p}" for p in problems))
    return PipelineDeclaration(**{_DECLARATION_KEYS[k]: v for k, v in raw.items()})


def team_model_name(namespace: str, model_name: str) -> str:
    """The registered model under the team's prefix: the only names its MLflow login may create
    (docker/mlflow/mlflow_team_auth.py)."""
    from workloads.jobspec import registered_model_prefix

    prefix = registered_model_prefix(namespace)
    return model_name if model_name.startswith(prefix) else prefix + model_name


def pipeline_spec(declaration: PipelineDeclaration, train_job: Mapping[str, Any], *, fsx_claim: str,
                  tracking_secret: Optional[str], cpu_node_selector: Mapping[str, str]) -> PipelineSpec:
    """The WorkflowTemplate's spec: the job's namespace and image, the declaration's defaults."""
    master = train_job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    train_args = next(c["args"] for c in master["containers"] if c["name"] == "pytorch")
    if not any(train_args[i:i + 3] == ["-m", "trainer", "train"] for i in range(len(train_args) - 2)):
        # The pipeline appends trainer overrides and evaluates/exports the trainer's checkpoints.
        raise ValueError(f"pipeline {declaration.name}: job spec {declaration.job_spec} runs your own code "
                         "(script/command); pipelines run the built-in trainer. Fix: submit it as a job, "
                         "or give the job spec trainer: {config: ...}")
    image = next(c["image"] for c in master["containers"] if c["name"] == "pytorch")
    uid = int((master.get("securityContext") or {}).get("runAsUser", TRAINER_UID))
    deadline = job_deadline_seconds(train_job)
    return PipelineSpec(
        name=declaration.name, namespace=train_job["metadata"]["namespace"], image=image, train_job=train_job,
        dataset=declaration.dataset, model_name=team_model_name(train_job["metadata"]["namespace"], declaration.model_name),
        job_spec=declaration.job_spec,
        fsx_claim=fsx_claim, tracking_secret=tracking_secret,
        cpu_node_selector=dict(cpu_node_selector), train_retry_limit=declaration.train_retry_limit,
        # The job's own deadline plus a day for preparing the data, evaluating and registering.
        active_deadline_seconds=deadline + 24 * 3600, uid=uid,
    )
