"""The ``scheduling`` section (team namespaces, quotas, priorities) and ``training``; their rules."""
from __future__ import annotations

from typing import Iterator, Optional

from pydantic import Field, field_validator

from workloads.problems import Problem
from infra.config.common import Environment, RoleArn, _Model
from infra.config.engine import Rule, invalid
from infra.config.gpu import _DURATION, GpuPoolConfig
from workloads.gpu_catalog import team_quota_problems
from workloads.scheduling import Priority, team_namespace
from workloads.tenancy import POSIX_ID_MAX, POSIX_ID_MIN, default_posix_id


class TeamConfig(_Model):
    """A team: its namespace, GPU quota per pool and default priority."""

    name: str = Field(pattern=r"^[a-z]([a-z0-9-]{0,40}[a-z0-9])?$", description="Namespace is team-<name>.")
    gpu_quota: dict[str, int] = Field(default_factory=dict, description="Pool name -> GPUs guaranteed to this team.")
    priority: Priority = Field(Priority.DEFAULT, description="production | research | default, for jobs that name none.")
    fair_sharing_weight: int = Field(1, ge=1, le=100)
    borrowing: bool = Field(True, description="May use other teams' idle GPUs (reclaimed by preemption).")
    role_arns: list[RoleArn] = Field(default_factory=list, description="IAM roles whose EKS access entries carry the team's Kubernetes group (bound to the platform's team Role in team-<name>).")
    posix_id: Optional[int] = Field(None, ge=POSIX_ID_MIN, le=POSIX_ID_MAX,
                                    description="uid and gid every pod of the team runs as (its files on FSx); default: derived from the name.")
    alert_emails: list[str] = Field(default_factory=list, description=(
        "Who gets the team's own alerts (its jobs' stalls, restart loops, failures: alerts labelled with its "
        "namespace), by e-mail through a topic of the team's; empty: they go to gpuIdleAlarm.alertEmails."))

    @field_validator("alert_emails")
    @classmethod
    def _alert_emails(cls, value: list[str]) -> list[str]:
        from components.gpu_idle_alarm import malformed_emails

        bad = malformed_emails(value)
        if bad:
            raise invalid(f"{bad} are not e-mail addresses", "list addresses such as research-oncall@example.com")
        return value

    @property
    def namespace(self) -> str:
        return team_namespace(self.name)

    @property
    def uid(self) -> int:
        return self.posix_id if self.posix_id is not None else default_posix_id(self.name)


class SchedulingConfig(_Model):
    """Priority classes, team namespaces with quotas, Kueue queues."""

    teams: list[TeamConfig] = Field(default_factory=list)
    wait_for_pods_ready_timeout: str = Field("10m", pattern=_DURATION, description="All-or-nothing admission timeout.")


class TrainingConfig(_Model):
    """Training jobs: Training Operator 1.9 (PyTorchJob) always; Trainer 2.3 (TrainJob) on request."""

    trainer_v2: bool = Field(False, description="Also install Kubeflow Trainer 2.3 (TrainJob, torch-distributed runtime).")
    run_record_retention_days: int = Field(90, ge=1, le=3650, description=(
        "Days a run's record (attempts, exit codes, nodes, cost) stays in the team's namespace after the run ended; "
        "the platform's run recorder keeps and removes them."))


def _team_rules(gpu_pools: list[GpuPoolConfig], teams: list[TeamConfig]) -> Iterator[Problem]:
    yield from team_quota_problems("scheduling.teams", teams, gpu_pools)
    # Two teams with one uid would own each other's files on the shared FSx.
    seen: dict[int, str] = {}
    for index, team in enumerate(teams):
        if team.uid in seen:
            yield Problem(f"scheduling.teams[{index}].posixId", team.uid,
                          f"is also team {seen[team.uid]}'s uid/gid: the two teams would own each other's files",
                          "set posixId to a value no other team uses")
        seen.setdefault(team.uid, team.name)


def _team_access(environment: Environment, teams: list[TeamConfig]) -> Iterator[Problem]:
    """In prod every team reaches its namespace through its own role's access entry: a team
    without one can only be served through an admin's credentials (security-4 N6)."""
    if environment is not Environment.PROD:
        return
    for index, team in enumerate(teams):
        if not team.role_arns:
            yield Problem(f"scheduling.teams[{index}].roleArns", [],
                          f"team {team.name} has no IAM role, so no access entry: its members could only use an admin's kubeconfig",
                          "list the team's IAM role ARN(s); members run aws eks update-kubeconfig --role-arn <that role>")


def _team_alerts(teams: list[TeamConfig], monitoring: object, gpu_idle_alarm: object) -> Iterator[Problem]:
    """A team's alerts reach its topic through Alertmanager's SNS identity, which exists only with
    monitoring and gpuIdleAlarm (the alerts' key and the platform's topic)."""
    if monitoring is not None and gpu_idle_alarm is not None:
        return
    missing = "monitoring" if monitoring is None else "gpuIdleAlarm"
    for index, team in enumerate(teams):
        if team.alert_emails:
            yield Problem(f"scheduling.teams[{index}].alertEmails", team.alert_emails,
                          f"team {team.name}'s alerts come from Alertmanager, which publishes to SNS only with "
                          f"monitoring and gpuIdleAlarm set ({missing} is not)",
                          f"set {missing}, or remove alertEmails")


# Listed in the order the loader runs them (infra.config.platform.RULES).
RULES: tuple[Rule, ...] = (
    Rule(("gpuPools", "scheduling.teams"), _team_rules),
    Rule(("environment", "scheduling.teams"), _team_access),
    Rule(("scheduling.teams", "monitoring", "gpuIdleAlarm"), _team_alerts),
)
