"""Config rules of logging, storage and encryption: lifecycles S3 refuses or bills early, prod log
retention, Object Lock, the audit-trail mode; and the organization-trail plan."""
from __future__ import annotations

import json

import pytest

from components.bucket import LifecycleRule
from components.log_archive import LogArchiveArgs
from workloads.problems import InvalidInputError
from infra.config import load_platform_config
from tests.conftest import problems_of, stack_config
from tests.infra.test_security_aws import Graph, allows


def test_glacier_ir_deleted_before_ninety_days_is_refused_with_the_fix():
    # The dev stack's old values: GLACIER_IR on day 60, deleted on day 90 (30 of 90 billed days).
    raw = stack_config("dev")
    raw["logArchive"].update(transitionToInfrequentAccessDays=30, transitionToGlacierDays=60, expirationDays=90)
    (problem,) = problems_of(raw)["logArchive.expirationDays"]
    assert problem.value == 90 and "GLACIER_IR" in problem.message and "early-deletion" in problem.message
    assert "150" in problem.fix and "transitionToGlacierDays" in problem.fix


def test_standard_ia_rules_apply_to_every_bucket_lifecycle():
    raw = stack_config("prod")
    raw["datasets"]["checkpointsBucket"] = {"transitionToInfrequentAccessDays": 30, "expirationDays": 45}
    raw["datasets"]["datasetsBucket"] = {"transitionToInfrequentAccessDays": 30, "transitionToGlacierDays": 40,
                                         "expirationDays": 400}
    raw["tracking"]["artifactsBucket"] = {"transitionToGlacierDays": 30, "expirationDays": 60}
    problems = problems_of(raw)
    (ia_expiry,) = problems["datasets.checkpointsBucket.expirationDays"]
    assert "STANDARD_IA" in ia_expiry.message and "60" in ia_expiry.fix
    (ia_to_glacier,) = problems["datasets.datasetsBucket.transitionToGlacierDays"]
    assert "30 days in STANDARD_IA" in ia_to_glacier.message and "60" in ia_to_glacier.fix
    (glacier_expiry,) = problems["tracking.artifactsBucket.expirationDays"]
    assert "120" in glacier_expiry.fix


def test_stack_files_lifecycles_are_free_of_early_deletion():
    for stack in ("dev", "prod"):
        load_platform_config(stack_config(stack))


def test_components_refuse_the_same_lifecycles_as_the_config():
    with pytest.raises(InvalidInputError, match="expirationDays"):
        LifecycleRule(id="x", transition_to_glacier_days=60, expiration_days=90)
    with pytest.raises(InvalidInputError, match="transitionToInfrequentAccessDays"):
        LifecycleRule(id="x", transition_to_infrequent_access_days=7)
    with pytest.raises(InvalidInputError, match="expirationDays"):
        LogArchiveArgs(flow_log_account_ids=["111122223333"], transition_to_glacier_days=60, expiration_days=90)
    LifecycleRule(id="ok", transition_to_infrequent_access_days=30, transition_to_glacier_days=60, expiration_days=150)


def test_prod_log_retention_below_a_year_is_refused_for_every_log_group_at_once():
    raw = stack_config("prod")
    raw["cluster"]["logRetentionDays"] = 30
    raw["datasets"]["fsx"]["logRetentionDays"] = 90
    raw["tracking"]["logRetentionDays"] = 14
    problems = problems_of(raw)
    for path, value in (("cluster.logRetentionDays", 30), ("datasets.fsx.logRetentionDays", 90),
                        ("tracking.logRetentionDays", 14)):
        (problem,) = problems[path]
        assert problem.value == value and "365" in problem.message and "365" in problem.fix
    dev = stack_config("dev")
    dev["cluster"]["logRetentionDays"] = 14
    load_platform_config(dev)


def test_object_lock_longer_than_the_lifecycle_is_refused():
    raw = stack_config("prod")
    raw["logArchive"]["expirationDays"] = 300
    raw["logArchive"]["objectLockRetentionDays"] = 400
    (problem,) = problems_of(raw)["logArchive.objectLockRetentionDays"]
    assert problem.value == 400 and "300" in problem.fix
    # The prod default (365) is named when it is the lock that conflicts.
    raw["logArchive"].pop("objectLockRetentionDays")
    (problem,) = problems_of(raw)["logArchive.objectLockRetentionDays"]
    assert "prod default 365" in problem.message


def test_object_lock_defaults_to_a_year_in_prod_and_off_in_dev():
    prod, dev = stack_config("prod"), stack_config("dev")
    prod["logArchive"].pop("objectLockRetentionDays", None)
    assert load_platform_config(prod).object_lock_retention_days == 365
    assert load_platform_config(dev).object_lock_retention_days is None


def test_audit_trail_mode_and_its_fields_must_agree():
    raw = stack_config("dev")
    raw["logArchive"]["auditTrail"] = {"mode": "organization"}
    problems = problems_of(raw)
    assert {"logArchive.auditTrail.organizationId", "logArchive.auditTrail.managementAccountId"} <= set(problems)
    raw["logArchive"]["auditTrail"] = {"mode": "account", "organizationId": "o-abcdef1234"}
    (problem,) = problems_of(raw)["logArchive.auditTrail.organizationId"]
    assert "mode: organization" in problem.fix
    raw["logArchive"]["auditTrail"] = {"mode": "organization", "organizationId": "org-1",
                                       "managementAccountId": "12345"}
    problems = problems_of(raw)
    assert {"logArchive.auditTrail.organizationId", "logArchive.auditTrail.managementAccountId"} <= set(problems)


def test_organization_trail_is_created_by_the_logging_account_and_admitted_by_the_archive(plan_config):
    raw = stack_config("dev")
    raw["logArchive"]["auditTrail"] = {"mode": "organization", "organizationId": "o-abcdef1234",
                                       "managementAccountId": "123456789012"}
    graph = Graph(plan_config("dev", raw))
    (trail,) = graph.all("aws:cloudtrail/trail:Trail")
    assert trail.inputs["isOrganizationTrail"] is True
    assert graph.account_id(trail) == graph.config.accounts.logging.id
    bucket = graph.bucket(trail.inputs["s3BucketName"])
    _, policy = graph.bucket_policy(bucket)
    # The management account owns an organization trail, whoever created it.
    arn = f"arn:aws:cloudtrail:{graph.config.region}:123456789012:trail/{trail.inputs['name']}"
    for directory in ("o-abcdef1234/444455556666", "123456789012"):
        key = f"{bucket.outputs['arn']}/{trail.inputs['s3KeyPrefix']}/AWSLogs/{directory}/CloudTrail/x.json.gz"
        assert allows(policy, principal=("Service", "cloudtrail.amazonaws.com"), action="s3:PutObject", resource=key,
                      context={"aws:SourceArn": arn, "s3:x-amz-acl": "bucket-owner-full-control"})
    _, key_policy = graph.key_policy(graph.key(trail.inputs["kmsKeyId"]))
    assert allows(key_policy, principal=("Service", "cloudtrail.amazonaws.com"), action="kms:GenerateDataKey",
                  resource="*", context={"aws:SourceArn": arn, "kms:EncryptionContext:aws:cloudtrail:arn": arn})
    assert trail.inputs["isMultiRegionTrail"] is True and trail.inputs["enableLogFileValidation"] is True


def test_no_nat_and_no_interface_endpoints_is_refused():
    raw = stack_config("dev")
    raw["network"]["nat"] = "none"
    raw["network"].pop("interfaceEndpoints")
    (problem,) = problems_of(raw)["network.interfaceEndpoints"]
    assert "defaults to off in dev" in problem.message and "interfaceEndpoints: true" in problem.fix
    raw["network"]["interfaceEndpoints"] = True
    load_platform_config(raw)


def test_plan_summarises_logging_and_warns_about_a_locked_dev_archive(prod_plan, plan_config):
    (section,) = [lines for title, lines in prod_plan.sections if title == "Logs and audit"]
    assert any("Object Lock COMPLIANCE 365 days" in line for line in section)
    assert any("CloudTrail S3 data events" in line and "mlp-break-glass" in line for line in section)
    assert any("logging, workload" in line for line in section)
    raw = stack_config("dev")
    raw["logArchive"]["objectLockRetentionDays"] = 30
    plan = plan_config("dev", raw)
    assert any("pulumi destroy" in w and "30 days" in w for w in plan.warnings)
    locks = plan.recording.by_type("aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration")
    assert [lock.inputs["rule"]["defaultRetention"]["days"] for lock in locks] == [30]
