"""The run recorder: the ``RunRecord`` CRD and the platform-side writer that keeps, in each team's
namespace, the record of every training run (attempts, exit codes and why they ended, the node's
instance and capacity type, node-hours and cost so far) which the team reads and cannot edit.
Manifests: ``workloads/run_records.py``; the recorder's code: ``workloads/run_recorder.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import pulumi

from components.cluster import Cluster
from components.k8s import apply_namespace_objects, apply_object
from workloads.run_records import crd, namespace_spec, run_record_objects
from workloads.system_namespaces import namespace_objects


@dataclass(frozen=True)
class RunRecordsArgs:
    """Args of ``RunRecords``.

    cluster: the cluster the recorder runs in (its VPC and Service CIDRs shape the namespace's
        egress policy).
    image: the platform's agent image (python3, standard library; ``gpuEnablement.nodeHealthImage``).
    retention_days: how long a record stays after its run ended (``training.runRecordRetentionDays``).
    """

    cluster: Cluster
    image: str
    retention_days: int

    def __post_init__(self) -> None:
        if not 1 <= self.retention_days <= 3650:
            raise ValueError(f"RunRecordsArgs.retention_days: {self.retention_days} is outside 1..3650 days")
        if not self.image:
            raise ValueError("RunRecordsArgs.image: the recorder needs the platform's agent image")


class RunRecords(pulumi.ComponentResource):
    def __init__(self, name: str, args: RunRecordsArgs, opts: Optional[pulumi.ResourceOptions] = None):
        super().__init__("mlplatform:run_records:RunRecords", name, None, opts)
        cluster = args.cluster
        self.namespace, self.network_policies = apply_namespace_objects(
            name, namespace_objects(namespace_spec(cluster.vpc_cidr, cluster.service_cidr)), self)
        self.crd = apply_object(f"{name}-crd", crd(), pulumi.ResourceOptions(parent=self))
        in_namespace = pulumi.ResourceOptions(parent=self, depends_on=[self.namespace, *self.network_policies, self.crd])
        self.objects = [
            apply_object(f"{name}-{obj['kind'].lower()}", obj, in_namespace)
            for obj in run_record_objects(image=args.image, retention_days=args.retention_days)
            if obj["kind"] != "CustomResourceDefinition"
        ]
        self.register_outputs({"crd": self.crd.id, "objects": len(self.objects)})
