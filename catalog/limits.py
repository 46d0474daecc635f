"""Service limits the platform's config sizes are checked against, each with its source.

A value above one of these fails at `pulumi up` (or deploys something AWS then refuses to
scale to); the config refuses it first (infra/config/common.py ``at_most``), naming the limit and where
it comes from. Quotas marked "default, adjustable" are the account defaults: raise the quota in
Service Quotas first, then the bound here in a reviewed change.
"""
from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class Limit:
    maximum: float
    what: str
    source: str


EKS_NODES_PER_MANAGED_NODE_GROUP = Limit(
    450, "Amazon EKS quota 'Nodes per managed node group' (default, adjustable)",
    "https://docs.aws.amazon.com/eks/latest/userguide/service-quotas.html")
KUBERNETES_NODES_PER_CLUSTER = Limit(
    5000, "Kubernetes' largest supported cluster (5,000 nodes)",
    "https://kubernetes.io/docs/setup/best-practices/cluster-large/")
FSX_LUSTRE_STORAGE_GIB = Limit(
    100800, "FSx for Lustre quota 'Lustre Persistent_2 SSD storage capacity' (default, adjustable)",
    "https://docs.aws.amazon.com/fsx/latest/LustreGuide/limits.html")
FSX_BACKUP_RETENTION_DAYS = Limit(
    90, "FSx AutomaticBackupRetentionDays (0-90)",
    "https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateFileSystemLustreConfiguration.html")
FSX_IMPORTED_FILE_CHUNK_MIB = Limit(
    512000, "FSx ImportedFileChunkSize (1-512,000 MiB)",
    "https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateDataRepositoryAssociation.html")
AURORA_SERVERLESS_V2_MAX_ACU = Limit(
    256, "Aurora Serverless v2 capacity (0-256 ACU)",
    "https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/aurora-serverless-v2.setting-capacity.html")
RDS_BACKUP_RETENTION_DAYS = Limit(
    35, "RDS BackupRetentionPeriod (1-35 days)",
    "https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_CreateDBCluster.html")
EBS_GP3_VOLUME_GIB = Limit(
    16384, "EBS gp3 volume size (1-16,384 GiB)",
    "https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html")
KMS_PENDING_WINDOW_DAYS = Limit(
    30, "KMS PendingWindowInDays (7-30)",
    "https://docs.aws.amazon.com/kms/latest/APIReference/API_ScheduleKeyDeletion.html")


KARPENTER_NODEPOOL_WEIGHT = Limit(
    100, "Karpenter NodePool spec.weight (1-100)",
    "karpenter 1.14.1 CRD karpenter.sh_nodepools.yaml, spec.weight: minimum 1, maximum 100")

# Aurora Serverless v2 capacity steps (0-256 ACU in steps of 0.5; source as above) and the CPU
# sizes of a Fargate task ("Task CPU and memory",
# https://docs.aws.amazon.com/AmazonECS/latest/developerguide/fargate-tasks-services.html#fargate-tasks-size).
MAX_ACU = int(AURORA_SERVERLESS_V2_MAX_ACU.maximum)
FARGATE_CPU_UNITS = (256, 512, 1024, 2048, 4096, 8192, 16384)
# Aurora Serverless v2 auto-pause: "Specify a value between 300 seconds (five minutes) and 86,400
# seconds (one day)" (https://docs.aws.amazon.com/AmazonRDS/latest/APIReference/API_ServerlessV2ScalingConfiguration.html).
MIN_AUTO_PAUSE_SECONDS = 300
MAX_AUTO_PAUSE_SECONDS = 86400

# FSx for Lustre PERSISTENT_2 (SSD): storage is 1,200 GiB, then multiples of 2,400 GiB (FSx API
# UpdateFileSystem StorageCapacity: "For SCRATCH_2, PERSISTENT_1, and PERSISTENT_2 SSD deployment
# types, valid values are in multiples of 2400 GiB"); throughput tiers "For PERSISTENT_2 SSD-based
# deployment types, valid values are 125, 250, 500, and 1000 MB/s/TiB"
# (https://docs.aws.amazon.com/fsx/latest/LustreGuide/managing-throughput-capacity.html); at most 8 data repository
# associations per file system (https://docs.aws.amazon.com/fsx/latest/LustreGuide/create-dra-linked-data-repo.html).
FSX_FIRST_CAPACITY_GIB = 1200
FSX_CAPACITY_STEP_GIB = 2400
FSX_THROUGHPUT_TIERS_MB_PER_TIB = (125, 250, 500, 1000)
FSX_MAX_DATA_REPOSITORY_ASSOCIATIONS = 8
LUSTRE_VERSION = "2.15"
# Lustre: 988 for LNet, 1018-1023 for the clients' privileged source ports
# (https://docs.aws.amazon.com/fsx/latest/LustreGuide/limit-access-security-groups.html).
LUSTRE_PORTS = ((988, 988), (1018, 1023))
