"""Training capability: the training operators, each team's trainer identity, and the platform
facts that job specs are rendered against.

Facts come from the stack's own Kubernetes objects as the offline plan records them
(``facts_from_plan``), overlaid with the deployed stack's outputs when the Pulumi CLI can read
them (``facts_for_stack``): the renderer never hard-codes a pool label, a queue or a bucket.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Optional

from components.datasets import DatasetBucket, write_throughput_mb_per_s
from components.tracking import K8S_SECRET_NAME
from components.training import (
    TeamTrainerAccess, TeamTrainerAccessArgs, TrainingOperators, TrainingOperatorsArgs, team_checkpoint_prefix,
)
from components.versions import TRAINER_VERSION, TRAINING_OPERATOR_VERSION
from infra.config import PlatformConfig
from infra.mock_engine import Recording
from infra.plan import Plan, build_plan, plan_section
from workloads.karpenter import NODE_ROLE_LABEL
from workloads.placement import system_pod_placement
from workloads.platform_facts import PlatformFacts, facts_from_manifests
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME

if TYPE_CHECKING:
    from infra.program import Platform


def deploy(platform: "Platform") -> dict[str, Any]:
    config = platform.config
    TrainingOperators(
        f"{config.name}-training",
        TrainingOperatorsArgs(trainer_v2=config.training.trainer_v2, trainer_replicas=2 if config.is_prod else 1),
        opts=platform.kubernetes_opts(),
    )
    outputs: dict[str, Any] = {"trainingOperatorVersion": TRAINING_OPERATOR_VERSION,
                               "trainerV2Runtime": TORCH_DISTRIBUTED_RUNTIME if config.training.trainer_v2 else None}
    datasets = platform.components.get("datasets")
    scheduling = platform.components.get("scheduling")
    teams = config.scheduling.teams
    if datasets is not None and teams:
        namespaces = {f"team-{t.name}": t.name for t in teams}
        ns_objects = getattr(scheduling, "namespaces", {}) if scheduling is not None else {}
        access = TeamTrainerAccess(
            f"{config.name}-trainer-access",
            TeamTrainerAccessArgs(
                cluster=platform.cluster, checkpoints_bucket=datasets.buckets[DatasetBucket.CHECKPOINTS],
                namespaces=list(namespaces), region=config.region,
                namespace_resources={ns: ns_objects[team] for ns, team in namespaces.items() if team in ns_objects},
                fsx=datasets, setup_placement=_setup_placement(config), tags=config.resource_tags,
            ),
            opts=platform.kubernetes_opts(),
        )
        outputs["trainerRoleArns"] = {ns: role.arn for ns, role in access.roles.items()}
    return outputs


def _setup_placement(config: PlatformConfig) -> dict[str, Any]:
    """One-shot setup pods go to the Karpenter CPU pool, or the system nodes when there is none."""
    if config.karpenter.cpu_pool.enabled:
        return {"nodeSelector": {NODE_ROLE_LABEL: "general"}}
    return system_pod_placement()


# -- facts for job specs -------------------------------------------------------------------
def _kubernetes_manifests(recording: Recording) -> list[dict[str, Any]]:
    return [dict(r.inputs) for r in recording.resources
            if r.type.startswith("kubernetes:") and not r.is_provider and "kind" in r.inputs]


def facts_from_plan(plan: Plan) -> PlatformFacts:
    config: PlatformConfig = plan.config
    recording = plan.recording
    bucket = next((r.outputs.get("bucket") for r in recording.resources
                   if r.type == "aws:s3/bucket:Bucket" and r.name == f"{config.name}-datasets-{DatasetBucket.CHECKPOINTS.value}-bucket"), None)
    fsx = next((r.inputs for r in recording.resources if r.type == "aws:fsx/lustreFileSystem:LustreFileSystem"), None)
    write_mb_s = (write_throughput_mb_per_s(int(fsx["storageCapacity"]), int(fsx["perUnitStorageThroughput"]))
                  if fsx else None)
    trainer_v2 = any(r.type == "kubernetes:helm.sh/v3:Release" and "kubeflow-trainer" in str(r.inputs.get("chart", ""))
                     for r in recording.resources)
    return facts_from_manifests(
        _kubernetes_manifests(recording), stack=plan.stack, region=config.region, tracking_secret_name=K8S_SECRET_NAME,
        checkpoints_bucket=bucket, fsx_write_mb_per_s=write_mb_s,
        trainer_v2_runtime=TORCH_DISTRIBUTED_RUNTIME if trainer_v2 else None,
    )


def stack_outputs(stack: str) -> Optional[dict[str, Any]]:
    """The deployed stack's outputs through the Pulumi CLI, or None (no CLI, not logged in...)."""
    if shutil.which("pulumi") is None:
        return None
    try:
        done = subprocess.run(["pulumi", "stack", "output", "--json", "--stack", stack], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)
    except ValueError:
        return None


def facts_for_stack(stack: str, *, use_outputs: bool = True) -> PlatformFacts:
    """Facts of a stack: its offline plan, with deployed names from the stack outputs if readable."""
    facts = facts_from_plan(build_plan(stack))
    outputs = stack_outputs(stack) if use_outputs else None
    if outputs:
        facts = replace(facts, checkpoints_bucket=outputs.get("checkpointsBucket") or facts.checkpoints_bucket,
                        notes=facts.notes + (f"names from `pulumi stack output --stack {stack}`",))
    else:
        facts = replace(facts, notes=facts.notes + ("from the offline plan (stack outputs not readable): bucket names are placeholders",))
    return facts


# -- plan ------------------------------------------------------------------------------------
@plan_section
def _training_section(config: PlatformConfig, recording: Recording) -> Optional[tuple[str, list[str]]]:
    lines = [f"Training Operator {TRAINING_OPERATOR_VERSION} (PyTorchJob kubeflow.org/v1) on the system nodes"]
    if config.training.trainer_v2:
        lines.append(f"Kubeflow Trainer {TRAINER_VERSION} (TrainJob, runtime {TORCH_DISTRIBUTED_RUNTIME})")
    for team in config.scheduling.teams:
        ns = f"team-{team.name}"
        lines.append(f"{ns}: service account trainer -> Pod Identity role, checkpoints bucket prefix {team_checkpoint_prefix(ns)}")
    lines.append("jobs: python -m workloads submit JOB.yaml --stack STACK [--dry-run | --local]")
    return "Training jobs", lines
