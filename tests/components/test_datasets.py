"""Datasets capability: buckets, FSx PERSISTENT_2 + DRAs, CSI add-on, static PV/PVC, config rules."""
from __future__ import annotations

import copy
import functools

import pytest

from components.datasets import (
    DataRepositoryAssociationSpec,
    DatasetBucket,
    association_problems,
    checkpoint_seconds,
    fsx_capacity_problems,
    is_valid_capacity,
)
from catalog.versions import EKS_ADDON_VERSIONS
from infra.config import ConfigError, load_platform_config
from infra.datasets import cross_az_warnings, spot_save_warnings
from tests.conftest import stack_config
from workloads.fsx import CLAIM_NAME, DATASETS_CLAIM_NAME, FsxVolumeSpec, fsx_persistent_volume, fsx_persistent_volume_claim

FSX = "aws:fsx/lustreFileSystem:LustreFileSystem"
DRA = "aws:fsx/dataRepositoryAssociation:DataRepositoryAssociation"
LUSTRE_PORT_RANGES = {(988, 988), (1018, 1023)}


# Dev runs datasets storage s3-mountpoint; its former FSx block keeps the FSx tests on a small
# file system (prod's is 9,600 GiB) and proves the fsx mode still plans in a dev stack.
DEV_FSX = {
    "storageCapacityGib": 1200, "perUnitStorageThroughputMbPerTib": 125, "subnetIndex": 0,
    "automaticBackupRetentionDays": 0, "logRetentionDays": 14,
    "dataRepositoryAssociations": [
        {"fileSystemPath": "/datasets", "bucket": "datasets", "importEvents": ["NEW", "CHANGED", "DELETED"],
         "exportEvents": ["NEW", "CHANGED"]},
        {"fileSystemPath": "/checkpoints", "bucket": "checkpoints", "importEvents": ["NEW", "CHANGED", "DELETED"],
         "exportEvents": ["NEW", "CHANGED", "DELETED"]},
    ],
}


def dev_with_fsx() -> dict:
    raw = stack_config("dev")
    raw["datasets"]["storage"] = "fsx"
    raw["datasets"]["fsx"] = copy.deepcopy(DEV_FSX)
    return raw


@functools.lru_cache(maxsize=None)
def _dev_fsx_plan():
    from infra.plan import plan_from_values
    from tests.conftest import to_values

    return plan_from_values("dev", to_values(dev_with_fsx()))


@pytest.fixture(scope="module", params=["dev-fsx", "prod"])
def fsx_plan(request, prod_plan):
    """Both FSx stacks: dev with storage fsx, and prod."""
    return _dev_fsx_plan() if request.param == "dev-fsx" else prod_plan


def _fs(plan):
    return plan.recording.one(FSX)


# -- plan: file system ------------------------------------------------------------------------
def test_file_system_is_persistent_2_lustre_215_kms_in_one_private_subnet(fsx_plan):
    plan = fsx_plan
    fs = _fs(plan)
    fsx_config = plan.config.datasets.fsx
    inputs = fs.inputs
    assert inputs["deploymentType"] == "PERSISTENT_2"
    assert inputs["fileSystemTypeVersion"] == "2.15"
    assert inputs["storageCapacity"] == fsx_config.storage_capacity_gib
    assert inputs["perUnitStorageThroughput"] == fsx_config.per_unit_storage_throughput_mb_per_tib
    key = plan.recording.one("aws:kms/key:Key", f"{plan.config.name}-datasets-data-key")
    assert inputs["kmsKeyId"] == key.outputs["arn"]
    private = plan.recording.one("aws:ec2/subnet:Subnet", _private_subnet_name(plan, fsx_config.subnet_index))
    assert inputs["subnetIds"] == private.id
    assert inputs["logConfiguration"]["destination"].startswith("arn:aws:logs:")
    assert inputs["logConfiguration"]["destination"].endswith(f":log-group:/aws/fsx/{plan.config.name}-datasets")
    assert inputs["automaticBackupRetentionDays"] == fsx_config.automatic_backup_retention_days
    assert fs.protect is plan.config.protect_stateful
    assert inputs["skipFinalBackup"] is (not plan.config.is_prod)


def _private_subnet_name(plan, index):
    subnets = [r.name for r in plan.recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in r.name]
    return sorted(subnets)[index] if len(subnets) > index else None


def test_prod_keeps_backups_dev_does_not(prod_plan):
    assert _fs(prod_plan).inputs["automaticBackupRetentionDays"] > 0
    assert _fs(_dev_fsx_plan()).inputs["automaticBackupRetentionDays"] == 0


def test_data_repository_associations_link_s3_with_import_and_export_events(fsx_plan):
    plan = fsx_plan
    fs = _fs(plan)
    dras = plan.recording.by_type(DRA)
    configured = plan.config.datasets.fsx.data_repository_associations
    assert len(dras) == len(configured) >= 2
    buckets = {r.name: r.outputs["bucket"] for r in plan.recording.by_type("aws:s3/bucket:Bucket")}
    # Pulumi registers resources concurrently: the recording's order is not the config's (seen
    # under a loaded machine), so each association is matched to its config by its path.
    dras = sorted(dras, key=lambda r: r.inputs["fileSystemPath"])
    configured = sorted(configured, key=lambda c: c.file_system_path)
    for dra, config in zip(dras, configured):
        inputs = dra.inputs
        assert inputs["fileSystemId"] == fs.id
        assert inputs["fileSystemPath"] == config.file_system_path
        bucket = buckets[f"{plan.config.name}-datasets-{config.bucket.value}-bucket"]
        assert inputs["dataRepositoryPath"] == f"s3://{bucket}/"
        assert inputs["batchImportMetaDataOnCreate"] is True
        assert inputs["deleteDataInFilesystem"] is False
        assert inputs["s3"]["autoImportPolicy"]["events"] == [e.value for e in config.import_events]
        assert inputs["s3"]["autoExportPolicy"]["events"] == [e.value for e in config.export_events]
        assert inputs["s3"]["autoImportPolicy"]["events"] and inputs["s3"]["autoExportPolicy"]["events"]
    checkpoints = next(d for d in dras if d.inputs["fileSystemPath"] == "/checkpoints")
    assert set(checkpoints.inputs["s3"]["autoExportPolicy"]["events"]) == {"NEW", "CHANGED", "DELETED"}


def _rules_on(plan, kind, group):
    return [r for r in plan.recording.by_type(f"aws:vpc/securityGroup{kind}Rule:SecurityGroup{kind}Rule")
            if r.inputs["securityGroupId"] == group.id]


def test_fsx_security_group_admits_only_lustre_ports_from_the_node_group(fsx_plan):
    plan = fsx_plan
    name = plan.config.name
    sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{name}-datasets-fsx-sg")
    node_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", f"{name}-cluster-node-sg")
    assert _fs(plan).inputs["securityGroupIds"] == [sg.id]
    # Standalone rules only: inline rules would make the provider revoke the standalone ones.
    assert not sg.inputs.get("ingress") and not sg.inputs.get("egress")
    for kind in ("Ingress", "Egress"):
        rules = _rules_on(plan, kind, sg)
        for rule in rules:
            assert rule.inputs["ipProtocol"] == "tcp"
            assert not rule.inputs.get("cidrIpv4") and not rule.inputs.get("cidrIpv6")
            assert rule.inputs["referencedSecurityGroupId"] in (node_sg.id, sg.id)
        for peer in (node_sg, sg):
            assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in rules
                    if r.inputs["referencedSecurityGroupId"] == peer.id} == LUSTRE_PORT_RANGES
    back = [r for r in plan.recording.by_type("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
            if r.inputs.get("referencedSecurityGroupId") == sg.id and r.inputs["securityGroupId"] != sg.id]
    assert {(r.inputs["fromPort"], r.inputs["toPort"]) for r in back} == LUSTRE_PORT_RANGES
    assert all(r.inputs["securityGroupId"] == node_sg.id for r in back)


def test_fsx_csi_addon_is_pinned_and_has_no_aws_role(fsx_plan):
    plan = fsx_plan
    # Static volumes only: the controller makes no AWS calls, so it gets no role at all.
    addon = plan.recording.one("aws:eks/addon:Addon", f"{plan.config.name}-datasets-aws-fsx-csi-driver")
    assert addon.inputs["addonVersion"] == EKS_ADDON_VERSIONS["aws-fsx-csi-driver"]
    assert not addon.inputs.get("podIdentityAssociations") and not addon.inputs.get("serviceAccountRoleArn")
    assert not [r for r in plan.recording.by_type("aws:iam/role:Role") if "fsx-csi" in r.name]
    node_group = plan.recording.one("aws:eks/nodeGroup:NodeGroup")
    assert node_group.urn in addon.dependencies


# -- plan: buckets ----------------------------------------------------------------------------
@pytest.mark.parametrize("bucket", ["datasets-datasets", "datasets-checkpoints", "mlflow-artifacts"])
def test_platform_buckets_are_private_kms_encrypted_versioned_and_logged(plan, bucket):
    name = f"{plan.config.name}-{bucket}"
    recording = plan.recording
    block = recording.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock", f"{name}-public-access").inputs
    assert all(block[k] is True for k in ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets"))
    rule = recording.one("aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
                         f"{name}-encryption").inputs["rules"][0]
    assert rule["applyServerSideEncryptionByDefault"]["sseAlgorithm"] == "aws:kms"
    assert rule["applyServerSideEncryptionByDefault"]["kmsMasterKeyId"].startswith("arn:aws:kms:")
    assert recording.one("aws:s3/bucketVersioning:BucketVersioning", f"{name}-versioning").inputs[
        "versioningConfiguration"] == {"status": "Enabled"}
    logging = recording.one("aws:s3/bucketLogging:BucketLogging", f"{name}-access-logs").inputs
    # S3 delivers access logs only within the account: the workload account's SSE-S3 log bucket.
    target = recording.one("aws:s3/bucket:Bucket", f"{plan.config.name}-workload-access-logs-bucket")
    assert logging["targetBucket"] == target.id
    assert logging["targetPrefix"].startswith("s3-access/")
    resource = recording.one("aws:s3/bucket:Bucket", f"{name}-bucket")
    assert resource.protect is plan.config.protect_stateful
    assert resource.inputs.get("forceDestroy") is (not plan.config.protect_stateful)


# -- static PV / PVC --------------------------------------------------------------------------
def test_static_volume_and_claim_per_namespace_validate_against_kubernetes_1_32(fsx_plan):
    plan = fsx_plan
    from tests.support.validation import validate_core

    fs = _fs(plan)
    namespaces = plan.config.team_namespaces
    pvs = plan.recording.by_type("kubernetes:core/v1:PersistentVolume")
    pvcs = plan.recording.by_type("kubernetes:core/v1:PersistentVolumeClaim")
    assert {p.inputs["metadata"]["namespace"] for p in pvcs} == set(namespaces)
    # Two per team: its own subtree read-write, the datasets read-only (never the root).
    assert len(pvs) == 2 * len(namespaces)
    for pv in pvs:
        assert validate_core(pv.inputs) == []
        spec = pv.inputs["spec"]
        namespace = spec["claimRef"]["namespace"]
        assert spec["csi"]["driver"] == "fsx.csi.aws.com"
        assert spec["csi"]["volumeHandle"] == fs.id
        subtree = {CLAIM_NAME: f"checkpoints/{namespace}", DATASETS_CLAIM_NAME: "datasets"}[spec["claimRef"]["name"]]
        # FSx CSI driver v1.7.0 NodePublishVolume mounts "<dnsname>@tcp:/<mountname>": a Lustre subdirectory mount.
        assert spec["csi"]["volumeAttributes"] == {"dnsname": fs.outputs["dnsName"],
                                                   "mountname": f"{fs.outputs['mountName']}/{subtree}"}
        read_only = spec["claimRef"]["name"] == DATASETS_CLAIM_NAME
        assert spec["accessModes"] == (["ReadOnlyMany"] if read_only else ["ReadWriteMany"])
        assert spec["csi"]["readOnly"] is read_only
        assert spec["mountOptions"] == ["flock"]
        assert spec["persistentVolumeReclaimPolicy"] == "Retain"
        # The platform's provider (pulumi-eks registers its own `-eks-k8s` one beside it).
        assert pv.provider == plan.recording.one("pulumi:providers:kubernetes", name=f"{plan.config.name}-cluster-k8s").urn
    for pvc in pvcs:
        assert validate_core(pvc.inputs) == []
        assert pvc.inputs["metadata"]["name"] in (CLAIM_NAME, DATASETS_CLAIM_NAME)
        assert pvc.inputs["spec"]["storageClassName"] == ""
        pv = next(p for p in pvs if p.inputs["metadata"]["name"] == pvc.inputs["spec"]["volumeName"])
        assert pv.inputs["spec"]["claimRef"] == {"namespace": pvc.inputs["metadata"]["namespace"],
                                                 "name": pvc.inputs["metadata"]["name"]}


def test_root_is_squashed_on_the_file_system(fsx_plan):
    plan = fsx_plan
    """FSx for Lustre User Guide, "Lustre root squash": RootSquash "UID:GID" maps root on every
    client (except NoSquashNids) to that identity; 65534 is nobody, no team's uid."""
    fs = plan.recording.one("aws:fsx/lustreFileSystem:LustreFileSystem")
    assert fs.inputs["rootSquashConfiguration"]["rootSquash"] == "65534:65534"
    assert not fs.inputs["rootSquashConfiguration"].get("noSquashNids")


def test_volume_builders_are_pure_and_refuse_a_non_fsx_handle():
    spec = FsxVolumeSpec(file_system_id="fs-0123456789abcdef0", dns_name="fs-0123456789abcdef0.fsx.us-west-2.amazonaws.com",
                         mount_name="abcdefgh", storage_capacity_gib=1200, namespace="team-a")
    assert fsx_persistent_volume(spec)["metadata"]["name"] == "fsx-team-a"
    assert fsx_persistent_volume_claim(spec)["spec"]["volumeName"] == "fsx-team-a"
    with pytest.raises(ValueError, match="fs-"):
        FsxVolumeSpec(file_system_id="vol-1", dns_name="x", mount_name="y", storage_capacity_gib=1200, namespace="a")


# -- pure rules ---------------------------------------------------------------------------------
def test_capacity_steps():
    assert [c for c in (1200, 2400, 3600, 4800, 7200, 1000, 2500) if is_valid_capacity(c)] == [1200, 2400, 4800, 7200]
    (problem,) = fsx_capacity_problems("fsx", 3600, 125)
    assert problem.fix == "use one of [2400, 4800]"


def _dra(path, bucket=DatasetBucket.DATASETS, prefix=""):
    return DataRepositoryAssociationSpec(file_system_path=path, bucket=bucket, prefix=prefix)


def test_association_rules():
    assert list(association_problems("fsx", [_dra("/datasets"), _dra("/checkpoints", DatasetBucket.CHECKPOINTS)])) == []
    nested = list(association_problems("fsx", [_dra("/data", prefix="a"), _dra("/data/imagenet/", prefix="b")]))
    assert [p.path for p in nested] == ["fsx.dataRepositoryAssociations[1].fileSystemPath"]
    assert "overlaps" in nested[0].message
    # /data and /datasets share a string prefix but are different directories.
    assert list(association_problems("fsx", [_dra("/data", prefix="a"), _dra("/datasets", prefix="b")])) == []
    overlapping_s3 = list(association_problems("fsx", [_dra("/a", prefix="imagenet"), _dra("/b", prefix="imagenet/train")]))
    assert [p.path for p in overlapping_s3] == ["fsx.dataRepositoryAssociations[1].prefix"]


def test_checkpoint_time_follows_capacity_and_tier():
    # 8B parameters x 16 B = 128 GB; 1200 GiB at 125 MB/s/TiB is ~146 MB/s.
    assert 850 < checkpoint_seconds(8_000_000_000, 1200, 125) < 900
    assert checkpoint_seconds(8_000_000_000, 9600, 500) < 30


# -- config validation (no mocks) -----------------------------------------------------------------
def _problems(raw):
    with pytest.raises(ConfigError) as caught:
        load_platform_config(raw)
    return {p.path: p for p in caught.value.problems}


def test_bad_storage_config_is_reported_all_at_once():
    raw = dev_with_fsx()
    fsx = raw["datasets"]["fsx"]
    fsx["storageCapacityGib"] = 3000
    fsx["perUnitStorageThroughputMbPerTib"] = 200
    fsx["dataRepositoryAssociations"] = [
        {"fileSystemPath": f"/d{i}", "bucket": "datasets", "prefix": f"p{i}"} for i in range(8)
    ] + [{"fileSystemPath": "/d1/nested", "bucket": "checkpoints"}]
    problems = _problems(raw)
    capacity = problems["datasets.fsx.storageCapacityGib"]
    assert capacity.value == 3000 and capacity.fix == "use one of [2400, 4800]"
    tier = problems["datasets.fsx.perUnitStorageThroughputMbPerTib"]
    assert tier.value == 200 and "125, 250, 500, 1000" in tier.fix
    count = problems["datasets.fsx.dataRepositoryAssociations"]
    assert count.value == 9 and "at most 8" in count.message
    overlap = problems["datasets.fsx.dataRepositoryAssociations[8].fileSystemPath"]
    assert overlap.value == "/d1/nested" and "/d1" in overlap.message


def test_duplicate_paths_and_unknown_events_are_errors():
    raw = stack_config("prod")
    dras = raw["datasets"]["fsx"]["dataRepositoryAssociations"]
    dras[1]["fileSystemPath"] = dras[0]["fileSystemPath"]
    problems = _problems(raw)
    assert "duplicates" in problems["datasets.fsx.dataRepositoryAssociations[1].fileSystemPath"].message
    raw = stack_config("prod")
    raw["datasets"]["fsx"]["dataRepositoryAssociations"][0]["exportEvents"] = ["NEW", "RENAMED"]
    problems = _problems(raw)
    bad = problems["datasets.fsx.dataRepositoryAssociations[0].exportEvents[1]"]
    assert bad.value == "RENAMED" and "NEW" in bad.fix


def test_spot_save_warning_when_fsx_is_too_slow_for_the_largest_model():
    raw = dev_with_fsx()
    assert list(spot_save_warnings(load_platform_config(raw))) == []
    raw["datasets"]["largestModelParameters"] = 8_000_000_000
    (warning,) = spot_save_warnings(load_platform_config(raw))
    assert "8.0B" in warning and "90 s" in warning and "146 MB/s" in warning


def test_prod_plan_has_no_spot_save_warning_and_dev_with_a_big_model_does(prod_plan, plan_config):
    assert not [w for w in prod_plan.warnings if "spot notice" in w]
    raw = dev_with_fsx()
    raw["datasets"]["largestModelParameters"] = 2_000_000_000
    assert [w for w in plan_config("dev", raw).warnings if "spot notice" in w]


def test_cross_az_warning_names_gpu_pools_outside_the_file_systems_az():
    raw = dev_with_fsx()
    fsx_az = raw["network"]["availabilityZones"][raw["datasets"]["fsx"]["subnetIndex"]]
    pools = raw.get("gpuPools") or []
    if not pools:
        pytest.skip("no GPU pools in the dev stack")
    for pool in pools:
        pool["zones"] = [fsx_az]
    assert list(cross_az_warnings(load_platform_config(raw))) == []
    pools[0]["zones"] = []
    (warning,) = cross_az_warnings(load_platform_config(raw))
    assert pools[0]["name"] in warning and fsx_az in warning


# -- storage mode s3-mountpoint (dev) ------------------------------------------------------------
def test_dev_mounts_datasets_through_mountpoint_and_team_subtrees_on_efs(dev_plan):
    """Same claims and paths as FSx, so jobs render the same. Mountpoint CSI: static provisioning
    only, ``csi.driver s3.csi.aws.com``, ``volumeAttributes.bucketName``; EFS CSI access points:
    ``volumeHandle: <fs-id>``, ``mountOptions: [tls, accesspoint=<fsap-id>]``."""
    from tests.support.validation import validate_core

    recording = dev_plan.recording
    assert dev_plan.config.datasets.storage.value == "s3-mountpoint"
    assert not recording.by_type(FSX)
    efs = recording.one("aws:efs/fileSystem:FileSystem")
    assert efs.inputs["encrypted"] is True and efs.inputs["throughputMode"] == "elastic"
    key = recording.one("aws:kms/key:Key", f"{dev_plan.config.name}-datasets-data-key")
    assert efs.inputs["kmsKeyId"] == key.outputs["arn"]
    subnets = [r for r in recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in r.name]
    targets = recording.by_type("aws:efs/mountTarget:MountTarget")
    assert sorted(t.inputs["subnetId"] for t in targets) == sorted(s.id for s in subnets)
    datasets_bucket = recording.one("aws:s3/bucket:Bucket", f"{dev_plan.config.name}-datasets-datasets-bucket")
    access_points = {a.inputs["rootDirectory"]["path"]: a for a in recording.by_type("aws:efs/accessPoint:AccessPoint")}
    namespaces = dev_plan.config.team_namespaces
    uids = {t.namespace: t.uid for t in dev_plan.config.scheduling.teams}
    pvs = {p.inputs["spec"]["claimRef"]["namespace"] + "/" + p.inputs["spec"]["claimRef"]["name"]: p
           for p in recording.by_type("kubernetes:core/v1:PersistentVolume")}
    assert len(pvs) == 2 * len(namespaces)
    for ns in namespaces:
        ap = access_points[f"/checkpoints/{ns}"]
        assert ap.inputs["posixUser"] == {"uid": uids[ns], "gid": uids[ns]}
        assert ap.inputs["rootDirectory"]["creationInfo"] == {"ownerUid": uids[ns], "ownerGid": uids[ns], "permissions": "0750"}
        team = pvs[f"{ns}/{CLAIM_NAME}"].inputs
        assert validate_core(team) == []
        assert team["spec"]["csi"] == {"driver": "efs.csi.aws.com", "volumeHandle": efs.id}
        assert team["spec"]["mountOptions"] == ["tls", f"accesspoint={ap.id}"]
        assert team["spec"]["accessModes"] == ["ReadWriteMany"]
        data = pvs[f"{ns}/{DATASETS_CLAIM_NAME}"].inputs
        assert validate_core(data) == []
        assert data["spec"]["csi"]["driver"] == "s3.csi.aws.com" and data["spec"]["csi"]["readOnly"] is True
        assert data["spec"]["csi"]["volumeAttributes"] == {"bucketName": datasets_bucket.outputs["bucket"]}
        assert "read-only" in data["spec"]["mountOptions"] and "region us-west-2" in data["spec"]["mountOptions"]
        assert data["spec"]["accessModes"] == ["ReadOnlyMany"]
    for pvc in recording.by_type("kubernetes:core/v1:PersistentVolumeClaim"):
        assert validate_core(pvc.inputs) == []
        pv = pvs[pvc.inputs["metadata"]["namespace"] + "/" + pvc.inputs["metadata"]["name"]]
        assert pvc.inputs["spec"]["volumeName"] == pv.inputs["metadata"]["name"]


def test_mountpoint_driver_reads_the_datasets_bucket_only(dev_plan):
    """The driver's Pod Identity role can list and get the datasets bucket and decrypt, nothing else:
    an attacker holding the node plugin's credentials cannot write, delete or read checkpoints."""
    import json

    recording = dev_plan.recording
    name = f"{dev_plan.config.name}-datasets"
    addon = recording.one("aws:eks/addon:Addon", f"{name}-aws-mountpoint-s3-csi-driver")
    assert addon.inputs["addonVersion"] == EKS_ADDON_VERSIONS["aws-mountpoint-s3-csi-driver"]
    association = recording.one("aws:eks/podIdentityAssociation:PodIdentityAssociation", f"{name}-mountpoint-association")
    assert (association.inputs["namespace"], association.inputs["serviceAccount"]) == ("kube-system", "s3-csi-driver-sa")
    policy = json.loads(recording.one("aws:iam/rolePolicy:RolePolicy", f"{name}-mountpoint-read").inputs["policy"])
    actions = {a for st in policy["Statement"] for a in st["Action"]}
    assert actions == {"s3:ListBucket", "s3:GetObject", "kms:Decrypt"}
    bucket = recording.one("aws:s3/bucket:Bucket", f"{name}-datasets-bucket").outputs["arn"]
    resources = {r for st in policy["Statement"] if st["Action"][0].startswith("s3:") for r in st["Resource"]}
    assert resources == {bucket, f"{bucket}/*"}
    assert recording.one("aws:eks/addon:Addon", f"{name}-aws-efs-csi-driver")


def test_storage_mode_rules():
    raw = stack_config("dev")
    raw["datasets"]["fsx"] = copy.deepcopy(DEV_FSX)
    assert _problems(raw)["datasets.fsx"].fix.startswith("remove datasets.fsx")
    raw = stack_config("dev")
    raw["datasets"]["storage"] = "fsx"
    assert "add datasets.fsx" in _problems(raw)["datasets.fsx"].fix
    raw = stack_config("prod")
    raw["datasets"]["storage"] = "s3-mountpoint"
    del raw["datasets"]["fsx"]
    problem = _problems(raw)["datasets.storage"]
    assert problem.value == "s3-mountpoint" and "fsx" in problem.fix


def test_without_the_general_cpu_pool_fsx_plans_and_s3_mountpoint_is_refused(plan_config):
    """FSx's CSI controller runs on the system nodes, so a stack without the general CPU pool
    plans; the Mountpoint controller tolerates no taint and can run only on a general node, so
    s3-mountpoint without the pool is a config problem naming the fix, never a traceback."""
    raw = dev_with_fsx()
    raw["karpenter"].setdefault("cpuPool", {})["enabled"] = False
    plan = plan_config("dev", raw)
    assert plan.recording.one("aws:fsx/lustreFileSystem:LustreFileSystem", f"{plan.config.name}-datasets-fsx")
    assert not [r for r in plan.recording.by_type("kubernetes:karpenter.sh/v1:NodePool")
                if r.inputs["metadata"]["name"] == "general"]
    raw = stack_config("dev")
    raw["karpenter"].setdefault("cpuPool", {})["enabled"] = False
    problem = _problems(raw)["karpenter.cpuPool.enabled"]
    assert "s3-mountpoint" in problem.message and "datasets.storage: fsx" in problem.fix
