"""Training capability: the training operators and each team's trainer identity.

The facts job specs are rendered against are read from a stack's plan in ``jobs.facts``.
"""
from __future__ import annotations

from typing import Any, Iterator

from components.datasets import DatasetBucket, Datasets
from components.run_records import RunRecords, RunRecordsArgs
from components.training import (
    TeamTrainerAccess, TeamTrainerAccessArgs, TrainingOperators, TrainingOperatorsArgs, team_checkpoint_prefix,
)
from catalog.versions import KUBEFLOW_TRAINER, TRAINER_VERSION, TRAINING_OPERATOR_VERSION, HelmChart
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.recording import Recording
from infra.platform import Platform
from workloads.trainingjob import TORCH_DISTRIBUTED_RUNTIME


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    TrainingOperators(
        f"{config.name}-training",
        TrainingOperatorsArgs(cluster=platform.cluster, trainer_v2=config.training.trainer_v2,
                              trainer_replicas=2 if config.is_prod else 1, charts=platform.charts),
        opts=platform.kubernetes_opts(),
    )
    image = config.gpu_enablement.node_health_image
    if image and config.gpu_pools:
        # The platform's account of every run (workloads/run_recorder.py), in the agent image.
        RunRecords(f"{config.name}-run-records",
                   RunRecordsArgs(cluster=platform.cluster, image=image,
                                  retention_days=config.training.run_record_retention_days),
                   opts=platform.kubernetes_opts())
    outputs: dict[str, Any] = {"trainingOperatorVersion": TRAINING_OPERATOR_VERSION,
                               "trainerV2Runtime": TORCH_DISTRIBUTED_RUNTIME if config.training.trainer_v2 else None}
    datasets = platform.datasets
    teams = config.scheduling.teams
    if datasets is not None and teams:
        access = TeamTrainerAccess(
            f"{config.name}-trainer-access",
            TeamTrainerAccessArgs(
                cluster=platform.cluster, checkpoints_bucket=datasets.buckets[DatasetBucket.CHECKPOINTS],
                namespaces=config.team_namespaces, region=config.region,
                namespace_resources=platform.team_namespace_resources(),
                fsx=datasets if datasets.file_system is not None else None, posix_ids={t.namespace: t.uid for t in teams},
                checkpoints_dra_prefix=_checkpoints_prefix(datasets), tags=config.resource_tags,
            ),
            opts=platform.kubernetes_opts(),
        )
        outputs["trainerRoleArns"] = {ns: role.arn for ns, role in access.roles.items()}
    return outputs


def _checkpoints_prefix(datasets: Datasets) -> str:
    """The S3 prefix behind /checkpoints (team directories are created through it)."""
    for dra in datasets.args.fsx.associations if datasets.args.fsx is not None else ():
        if dra.bucket is DatasetBucket.CHECKPOINTS:
            return dra.prefix
    return ""


# -- plan ------------------------------------------------------------------------------------
def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    lines = [f"Training Operator {TRAINING_OPERATOR_VERSION} (PyTorchJob kubeflow.org/v1) on the system nodes"]
    if config.training.trainer_v2:
        lines.append(f"Kubeflow Trainer {TRAINER_VERSION} (TrainJob, runtime {TORCH_DISTRIBUTED_RUNTIME})")
    for team in config.scheduling.teams:
        ns = team.namespace
        lines.append(f"{ns}: service account trainer -> Pod Identity role, checkpoints bucket prefix {team_checkpoint_prefix(ns)}")
    if config.gpu_enablement.node_health_image and config.gpu_pools:
        lines.append(f"run records (RunRecord, mlplatform.io/v1alpha1) in each team namespace, written by the run "
                     f"recorder in mlplatform-system; kept {config.training.run_record_retention_days} days after a run ends")
    lines.append("jobs: python -m workloads submit JOB.yaml --stack STACK [--dry-run | --local]")
    yield "Training jobs", lines


def charts(config: PlatformConfig) -> list[HelmChart]:
    """Kubeflow Trainer v2's chart when it is on (the Training Operator is a kustomize overlay)."""
    return [KUBEFLOW_TRAINER] if config.training.trainer_v2 else []


CAPABILITY = Capability("training", deploy=deploy, plan_sections=plan_sections, charts=charts)
