"""Container image repositories (ECR) in the automation account, pullable from the workload accounts."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import pulumi
import pulumi_aws as aws

from components.kms import create_key

# What a puller needs (ECR User Guide, "Private repository policy examples": pull access).
ECR_PULL_ACTIONS = ["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"]
# The type token the component had in components/tracking.py, kept: it is part of the URN of the
# component and of each direct child (`...ImageRepositories$aws:ecr/repository:Repository::...`),
# so a new token would need an alias on every child as well, for no change in what is deployed.
TYPE_TOKEN = "mlplatform:tracking:ImageRepositories"


@dataclass(frozen=True)
class ImageRepositoriesArgs:
    """ECR repositories in the automation account, pullable from the workload accounts.

    Attributes:
        repository_names: e.g. ``{"mlflow": "mlp/mlflow", "trainer": "mlp/trainer"}``.
        puller_account_ids: accounts whose principals may pull.
        untagged_expiration_days: untagged (superseded) images are deleted after this.
    """

    repository_names: Mapping[str, str]
    puller_account_ids: Sequence[str]
    untagged_expiration_days: int = 14
    protect: bool = False
    tags: Mapping[str, str] = field(default_factory=dict)


class ImageRepositories(pulumi.ComponentResource):
    """Immutable, scanned, KMS-encrypted repositories shared with the workload accounts."""

    repositories: dict[str, aws.ecr.Repository]

    def __init__(self, name: str, args: ImageRepositoriesArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__(TYPE_TOKEN, name, None, opts)
        tags = dict(args.tags)
        partition = aws.get_partition_output(opts=pulumi.InvokeOutputOptions(parent=self)).partition
        pullers = [pulumi.Output.concat("arn:", partition, ":iam::", account, ":root") for account in args.puller_account_ids]
        self.key = create_key(
            f"{name}-ecr", description="Encrypts the platform's container images", parent=self, tags=tags,
            protect=args.protect,
            service_statements=[{
                # Layers are decrypted by ECR on behalf of the pulling account.
                "Sid": "PullersDecryptThroughEcr", "Effect": "Allow",
                "Principal": {"AWS": pullers},
                "Action": ["kms:Decrypt", "kms:DescribeKey"], "Resource": "*",
                "Condition": {"StringLike": {"kms:ViaService": "ecr.*.amazonaws.com"}},
            }],
        )
        self.repositories = {}
        for key, repo_name in args.repository_names.items():
            repo = aws.ecr.Repository(
                f"{name}-{key}", name=repo_name, image_tag_mutability="IMMUTABLE",
                image_scanning_configuration={"scan_on_push": True},
                encryption_configurations=[{"encryption_type": "KMS", "kms_key": self.key.arn}],
                force_delete=not args.protect, tags=tags,
                opts=pulumi.ResourceOptions(parent=self, protect=args.protect),
            )
            aws.ecr.RepositoryPolicy(
                f"{name}-{key}-policy", repository=repo.name,
                policy=pulumi.Output.json_dumps({"Version": "2012-10-17", "Statement": [{
                    "Sid": "WorkloadAccountsPull", "Effect": "Allow",
                    "Principal": {"AWS": pullers},
                    "Action": ECR_PULL_ACTIONS}]}),
                opts=pulumi.ResourceOptions(parent=repo),
            )
            aws.ecr.LifecyclePolicy(
                f"{name}-{key}-lifecycle", repository=repo.name,
                policy=json.dumps({"rules": [{
                    "rulePriority": 1, "description": "expire untagged images",
                    "selection": {"tagStatus": "untagged", "countType": "sinceImagePushed",
                                  "countUnit": "days", "countNumber": args.untagged_expiration_days},
                    "action": {"type": "expire"}}]}),
                opts=pulumi.ResourceOptions(parent=repo),
            )
            self.repositories[key] = repo
        self.register_outputs({key: repo.repository_url for key, repo in self.repositories.items()})
