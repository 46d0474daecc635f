"""Capability: datasets (S3 datasets and checkpoints buckets, FSx for Lustre, a claim per team).

config -> components. Every team namespace (``scheduling.teams``) gets the FSx claim.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Iterator

from components.datasets import (
    SPOT_NOTICE_SECONDS,
    DatasetBucket,
    Datasets,
    DatasetsArgs,
    DatasetsStorage,
    checkpoint_seconds,
    fsx_log_group_name,
    write_throughput_mb_per_s,
)
from catalog.versions import addon_versions
from infra import costs
from infra.capability import Capability
from infra.config import PlatformConfig
from infra.costs import CostLine
from infra.recording import Recording
from infra.platform import Platform, datasets_name


def log_group_names(config: PlatformConfig) -> list[str]:
    """CloudWatch log groups this capability creates (the platform's log key must admit them)."""
    if config.datasets is None or config.datasets.storage is not DatasetsStorage.FSX:
        return []
    return [fsx_log_group_name(datasets_name(config))]


def _general_node_pool(platform: Platform) -> list[Any]:
    """The general CPU NodePool (gpu capacity capability), where untolerating controllers land."""
    pools = platform.node_pools.node_pools if platform.node_pools is not None else {}
    cpu = platform.config.cpu_pool_spec
    return [pools[cpu.name]] if cpu is not None and cpu.name in pools else []


def deploy(platform: Platform) -> dict[str, Any]:
    config = platform.config
    if config.datasets is None:
        return {}
    datasets_config = config.datasets
    fsx = datasets_config.fsx
    releases = addon_versions(config.cluster.version)
    datasets = Datasets(
        datasets_name(config),
        DatasetsArgs(
            network=platform.network, cluster=platform.cluster, storage=datasets_config.storage,
            posix_ids={team.namespace: team.uid for team in config.scheduling.teams},
            fsx=None if fsx is None else fsx.args(),
            namespaces=config.team_namespaces, namespace_resources=platform.team_namespace_resources(),
            access_logs_bucket=platform.access_log_bucket("workload"),
            log_kms_key=platform.log_group_key.key if platform.log_group_key else None,
            datasets_lifecycle=[datasets_config.datasets_bucket.rule("datasets")],
            checkpoints_lifecycle=[datasets_config.checkpoints_bucket.rule("checkpoints")],
            general_capacity=_general_node_pool(platform),
            # The builds of the cluster's own Kubernetes minor (catalog/versions.py EKS_RELEASES).
            addon_version=releases["aws-fsx-csi-driver"],
            mountpoint_addon_version=releases["aws-mountpoint-s3-csi-driver"],
            efs_addon_version=releases["aws-efs-csi-driver"],
            protect=config.protect_stateful, tags=config.resource_tags,
        ),
        opts=platform.kubernetes_opts(),
    )
    platform.datasets = datasets
    if datasets.file_system is not None:
        storage = {"fsxFileSystemId": datasets.file_system.id, "fsxDnsName": datasets.file_system.dns_name,
                   "fsxMountName": datasets.file_system.mount_name}
    else:
        storage = {"efsFileSystemId": datasets.efs.id}
    return {
        **storage,
        "datasetsBucket": datasets.buckets[DatasetBucket.DATASETS].name,
        "checkpointsBucket": datasets.buckets[DatasetBucket.CHECKPOINTS].name,
    }


# -- plan: warnings and a section ---------------------------------------------------------------
def spot_save_warnings(config: PlatformConfig) -> Iterator[str]:
    ds = config.datasets
    if ds is None or ds.fsx is None:
        return
    fsx = ds.fsx
    budget = SPOT_NOTICE_SECONDS - ds.spot_notice_margin_seconds
    seconds = checkpoint_seconds(ds.largest_model_parameters, fsx.storage_capacity_gib,
                                 fsx.per_unit_storage_throughput_mb_per_tib)
    if seconds > budget:
        mb_s = write_throughput_mb_per_s(fsx.storage_capacity_gib, fsx.per_unit_storage_throughput_mb_per_tib)
        yield (f"FSx writes {mb_s:.0f} MB/s ({fsx.storage_capacity_gib} GiB x {fsx.per_unit_storage_throughput_mb_per_tib} "
               f"MB/s/TiB): saving the state of a {ds.largest_model_parameters / 1e9:.1f}B-parameter model (~16 B/param) "
               f"takes ~{seconds:.0f} s, more than the {budget} s left of a spot notice; raise "
               "datasets.fsx.storageCapacityGib or perUnitStorageThroughputMbPerTib, or train it on on-demand capacity")


def cross_az_warnings(config: PlatformConfig) -> Iterator[str]:
    """GPU pools that may launch outside the file system's AZ pay cross-AZ latency and traffic."""
    if config.datasets is None or config.datasets.fsx is None:
        return
    fsx_az = config.network.availability_zones[config.datasets.fsx.subnet_index]
    spread = [pool.name for pool in config.gpu_pools if set(pool.zones or config.network.availability_zones) != {fsx_az}]
    if spread:
        yield (f"FSx for Lustre lives in {fsx_az} only; GPU pools {spread} may launch in other AZs and read it "
               f"across AZs (higher latency, $0.01/GB each way): set their zones to [{fsx_az}] for training pools")


def plan_sections(config: PlatformConfig, recording: Recording) -> Iterator[tuple[str, list[str]]]:
    if config.datasets is None:
        return
    if config.datasets.fsx is None:
        yield "Datasets", [
            "Datasets storage s3-mountpoint: datasets bucket read-only through Mountpoint for Amazon S3, team subtrees "
            f"on EFS (access points, team uid); claims in {', '.join(config.team_namespaces) or 'no namespace'}"]
        return
    fsx = config.datasets.fsx
    yield "Datasets", [
        f"FSx PERSISTENT_2 {fsx.storage_capacity_gib} GiB x {fsx.per_unit_storage_throughput_mb_per_tib} MB/s/TiB "
        f"= {write_throughput_mb_per_s(fsx.storage_capacity_gib, fsx.per_unit_storage_throughput_mb_per_tib):.0f} MB/s, "
        f"{len(fsx.data_repository_associations)} DRA(s), PVC in {', '.join(config.team_namespaces) or 'no namespace'}"]


def warnings(config: PlatformConfig, recording: Recording) -> Iterator[str]:
    yield from spot_save_warnings(config)
    yield from cross_az_warnings(config)


def cost_lines(recording: Recording, today: dt.date) -> Iterator[CostLine]:
    yield from costs.file_systems(recording)


CAPABILITY = Capability("datasets", deploy=deploy, plan_sections=plan_sections, warnings=warnings,
                        cost_lines=cost_lines, log_group_names=log_group_names)
