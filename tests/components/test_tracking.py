"""Tracking capability: Aurora Serverless v2, Fargate service, HTTPS ALBs, ECR, secrets, config rules."""
from __future__ import annotations

import json

import pytest

from components.mlflow_server import HEALTH_CHECK_PATH, SECRET_ENV_NAMES, MlflowServerSettings, mlflow_server_command
from components.versions import AURORA_POSTGRESQL_VERSION
from infra.config import ConfigError, load_platform_config
from infra.datasets_tracking import team_namespaces
from tests.conftest import stack_config

SG_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
# ELB policies that allow only TLS 1.2 and 1.3 (the API default, ELBSecurityPolicy-2016-08, allows 1.0).
TLS12_PLUS_POLICIES = {"ELBSecurityPolicy-TLS13-1-2-2021-06", "ELBSecurityPolicy-TLS13-1-2-Res-2021-06",
                       "ELBSecurityPolicy-TLS13-1-3-2021-06", "ELBSecurityPolicy-TLS13-1-2-Ext1-2021-06"}


def _name(plan, suffix):
    return f"{plan.config.name}-mlflow-{suffix}"


def _container(plan):
    task = plan.recording.one("aws:ecs/taskDefinition:TaskDefinition")
    (container,) = json.loads(task.inputs["containerDefinitions"])
    return task, container


# -- Aurora ------------------------------------------------------------------------------------
def test_aurora_serverless_v2_is_encrypted_private_and_scales_from_config(plan):
    db = plan.recording.one("aws:rds/cluster:Cluster")
    config = plan.config.tracking.database
    inputs = db.inputs
    assert (inputs["engine"], inputs["engineMode"], inputs["engineVersion"]) == (
        "aurora-postgresql", "provisioned", AURORA_POSTGRESQL_VERSION)
    scaling = inputs["serverlessv2ScalingConfiguration"]
    assert scaling["minCapacity"] == config.min_capacity_acu
    assert scaling["maxCapacity"] == config.max_capacity_acu
    assert scaling.get("secondsUntilAutoPause") == config.seconds_until_auto_pause
    key = plan.recording.one("aws:kms/key:Key", _name(plan, "tracking-key"))
    assert inputs["storageEncrypted"] is True and inputs["kmsKeyId"] == key.outputs["arn"]
    assert inputs["manageMasterUserPassword"] is True and "masterPassword" not in inputs
    subnets = plan.recording.one("aws:rds/subnetGroup:SubnetGroup")
    private_ids = sorted(s.id for s in plan.recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in s.name)
    assert sorted(subnets.inputs["subnetIds"]) == private_ids
    instances = plan.recording.by_type("aws:rds/clusterInstance:ClusterInstance")
    assert len(instances) == (2 if plan.config.is_prod else 1)
    prod = plan.config.is_prod
    for instance in instances:
        assert instance.inputs["instanceClass"] == "db.serverless"
        assert instance.inputs["publiclyAccessible"] is False
        assert instance.inputs["clusterIdentifier"] == db.id
        assert instance.protect is prod
    assert db.protect is prod
    assert inputs["deletionProtection"] is prod
    assert inputs["skipFinalSnapshot"] is (not prod)
    assert bool(inputs.get("finalSnapshotIdentifier")) is prod


def test_prod_database_has_a_failover_reader(prod_plan):
    assert len(prod_plan.recording.by_type("aws:rds/clusterInstance:ClusterInstance")) >= 2


def test_dev_database_pauses_at_zero_acu(dev_plan):
    scaling = dev_plan.recording.one("aws:rds/cluster:Cluster").inputs["serverlessv2ScalingConfiguration"]
    assert scaling["minCapacity"] == 0 and 300 <= scaling["secondsUntilAutoPause"] <= 86400


def test_database_admits_postgres_from_the_mlflow_service_only(plan):
    db_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", _name(plan, "db-sg"))
    service_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", _name(plan, "service-sg"))
    assert plan.recording.one("aws:rds/cluster:Cluster").inputs["vpcSecurityGroupIds"] == [db_sg.id]
    assert not db_sg.inputs.get("ingress") and not db_sg.inputs.get("egress")
    rules = [r.inputs for r in plan.recording.by_type(SG_IN) if r.inputs["securityGroupId"] == db_sg.id]
    assert rules == [{**rules[0], "referencedSecurityGroupId": service_sg.id, "fromPort": 5432, "toPort": 5432,
                      "ipProtocol": "tcp"}]
    assert "cidrIpv4" not in rules[0]


# -- ECS -----------------------------------------------------------------------------------------
def test_service_runs_in_private_subnets_without_public_ip(plan):
    service = plan.recording.one("aws:ecs/service:Service").inputs
    network = service["networkConfiguration"]
    assert network["assignPublicIp"] is False
    private_ids = sorted(s.id for s in plan.recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in s.name)
    assert sorted(network["subnets"]) == private_ids
    assert service["launchType"] == "FARGATE"
    assert service["deploymentCircuitBreaker"] == {"enable": True, "rollback": True}
    assert service["desiredCount"] == plan.config.tracking.desired_count
    cluster = plan.recording.one("aws:ecs/cluster:Cluster").inputs
    assert {"name": "containerInsights", "value": "enabled"} in cluster["settings"]


def test_task_runs_the_same_command_as_the_integration_test(plan):
    task, container = _container(plan)
    bucket = plan.recording.one("aws:s3/bucket:Bucket", _name(plan, "artifacts-bucket")).outputs["bucket"]
    db = plan.recording.one("aws:rds/cluster:Cluster")
    expected_command, expected_env = mlflow_server_command(MlflowServerSettings(
        artifacts_destination=f"s3://{bucket}/artifacts", allowed_hosts=[plan.config.tracking.domain_name],
        database_host=db.outputs["endpoint"], num_workers=plan.config.tracking.num_workers))
    assert container["command"] == expected_command
    assert {e["name"]: e["value"] for e in container["environment"]} == expected_env
    assert "--serve-artifacts" in expected_command
    assert expected_env["MLFLOW_SQLALCHEMYSTORE_POOLCLASS"] == "NullPool"
    assert container["image"] == plan.config.tracking.image
    assert container["readonlyRootFilesystem"] is True
    assert container["mountPoints"][0]["containerPath"] == expected_env["MLFLOW_SCRATCH_DIR"]
    assert container["logConfiguration"]["logDriver"] == "awslogs"
    secrets = {s["name"]: s["valueFrom"] for s in container["secrets"]}
    assert set(secrets) == set(SECRET_ENV_NAMES)
    db_secret = db.outputs["masterUserSecrets"][0]["secretArn"]
    assert secrets["MLFLOW_DB_PASSWORD"] == f"{db_secret}:password::"
    # No secret value in the plain environment.
    assert not set(expected_env) & set(SECRET_ENV_NAMES)
    assert task.inputs["networkMode"] == "awsvpc" and task.inputs["requiresCompatibilities"] == ["FARGATE"]


def test_prod_image_is_digest_pinned(prod_plan):
    assert "@sha256:" in _container(prod_plan)[1]["image"]


def test_roles_are_separate_and_least_privilege(plan):
    task = plan.recording.one("aws:ecs/taskDefinition:TaskDefinition").inputs
    execution = plan.recording.one("aws:iam/role:Role", _name(plan, "execution"))
    task_role = plan.recording.one("aws:iam/role:Role", _name(plan, "task"))
    assert task["executionRoleArn"] == execution.outputs["arn"] != task["taskRoleArn"] == task_role.outputs["arn"]
    policies = {p.name: json.loads(p.inputs["policy"]) for p in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy")
                if p.inputs["role"] in (execution.id, task_role.id)}
    execution_policy = policies[_name(plan, "execution-policy")]
    secret_reads = [s for s in execution_policy["Statement"] if s["Action"] == "secretsmanager:GetSecretValue"]
    assert len(secret_reads) == 1 and len(secret_reads[0]["Resource"]) == 3 and "*" not in secret_reads[0]["Resource"]
    artifacts_policy = policies[f"{_name(plan, 'artifacts')}-read-write-{_name(plan, 'task')}"]
    bucket_arn = plan.recording.one("aws:s3/bucket:Bucket", _name(plan, "artifacts-bucket")).outputs["arn"]
    resources = {r for s in artifacts_policy["Statement"] for r in s["Resource"]}
    assert bucket_arn in resources and all(r.startswith(bucket_arn) or ":kms:" in r for r in resources)
    # The task role reads no secrets, the execution role touches no artifacts.
    assert not any("secretsmanager" in str(s["Action"]) for s in artifacts_policy["Statement"])
    assert not any("s3:" in str(s["Action"]) for s in execution_policy["Statement"])


def test_flask_key_never_enters_the_state(plan):
    versions = {v.name: v.inputs for v in plan.recording.by_type("aws:secretsmanager/secretVersion:SecretVersion")}
    flask = versions[_name(plan, "flask-secret-key-value")]
    assert "secretString" not in flask and flask["secretStringWoVersion"] == 1


# -- load balancers -------------------------------------------------------------------------------
def test_https_listeners_use_tls12_plus_and_http_redirects(plan):
    listeners = plan.recording.by_type("aws:lb/listener:Listener")
    lbs = plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer")
    assert len(listeners) == 2 * len(lbs)
    https = [l.inputs for l in listeners if l.inputs["port"] == 443]
    http = [l.inputs for l in listeners if l.inputs["port"] == 80]
    assert len(https) == len(http) == len(lbs)
    validated = plan.recording.one("aws:acm/certificateValidation:CertificateValidation")
    for listener in https:
        assert listener["protocol"] == "HTTPS" and listener["sslPolicy"] in TLS12_PLUS_POLICIES
        assert listener["certificateArn"] == validated.inputs["certificateArn"]
        assert listener["defaultActions"][0]["type"] == "forward"
    for listener in http:
        (action,) = listener["defaultActions"]
        assert action["type"] == "redirect"
        assert action["redirect"] == {"protocol": "HTTPS", "port": "443", "statusCode": "HTTP_301"}


def test_load_balancers_log_drop_bad_headers_and_are_protected_in_prod(plan):
    logs_bucket = plan.recording.one("aws:s3/bucket:Bucket", f"{plan.config.name}-alb-logs-bucket")
    sse = plan.recording.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        f"{plan.config.name}-alb-logs-encryption").inputs["rules"][0]["applyServerSideEncryptionByDefault"]
    assert sse == {"sseAlgorithm": "AES256"}  # ALB log delivery cannot write SSE-KMS buckets
    graph = {n["name"]: n for n in plan.graph}
    assert graph[f"{plan.config.name}-alb-logs-bucket"]["account"] == "logging"
    for lb in plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer"):
        assert lb.inputs["accessLogs"] == {"bucket": logs_bucket.outputs["bucket"], "prefix": "alb", "enabled": True}
        assert lb.inputs["dropInvalidHeaderFields"] is True
        assert lb.inputs["enableDeletionProtection"] is plan.config.is_prod
    for tg in plan.recording.by_type("aws:lb/targetGroup:TargetGroup"):
        assert tg.inputs["targetType"] == "ip" and tg.inputs["port"] == 5000
        assert tg.inputs["healthCheck"]["path"] == HEALTH_CHECK_PATH == "/health"


def test_in_cluster_clients_reach_an_internal_load_balancer(plan):
    internal = [lb for lb in plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer") if lb.inputs["internal"]]
    assert len(internal) == 1
    zone = plan.recording.one("aws:route53/zone:Zone")
    assert zone.inputs["name"] == plan.config.tracking.domain_name
    assert zone.inputs["vpcs"][0]["vpcId"] == plan.recording.one("aws:ec2/vpc:Vpc").id
    record = plan.recording.one("aws:route53/record:Record", _name(plan, "private-record"))
    assert record.inputs["aliases"][0]["name"] == internal[0].outputs["dnsName"]
    for secret in plan.recording.by_type("kubernetes:core/v1:Secret"):
        if secret.inputs["metadata"]["name"] == "mlflow-tracking":
            assert secret.inputs["stringData"] == "[secret]"  # the password makes the whole map secret
    namespaces = {s.inputs["metadata"]["namespace"] for s in plan.recording.by_type("kubernetes:core/v1:Secret")
                  if s.inputs["metadata"]["name"] == "mlflow-tracking"}
    assert namespaces == set(team_namespaces(plan.config))


def test_prod_is_also_internet_facing_but_only_for_listed_cidrs(prod_plan, dev_plan):
    external = [lb for lb in prod_plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer") if not lb.inputs["internal"]]
    assert len(external) == 1
    public_ids = sorted(s.id for s in prod_plan.recording.by_type("aws:ec2/subnet:Subnet") if "-public-" in s.name)
    assert sorted(external[0].inputs["subnets"]) == public_ids
    alb_sg = prod_plan.recording.one("aws:ec2/securityGroup:SecurityGroup", "mlp-prod-mlflow-alb-sg")
    cidrs = {r.inputs["cidrIpv4"] for r in prod_plan.recording.by_type(SG_IN) if r.inputs["securityGroupId"] == alb_sg.id}
    vpc_cidr = str(prod_plan.config.network.cidr)
    assert cidrs == {vpc_cidr, *(str(c) for c in prod_plan.config.tracking.ingress_cidrs)}
    assert "0.0.0.0/0" not in cidrs
    assert all(lb.inputs["internal"] for lb in dev_plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer"))


# -- ECR in the automation account ---------------------------------------------------------------
def test_image_repositories_live_in_automation_and_let_the_workload_account_pull(plan):
    graph = {(n["type"], n["name"]): n for n in plan.graph}
    repos = plan.recording.by_type("aws:ecr/repository:Repository")
    assert {r.inputs["name"] for r in repos} == {f"{plan.config.name}/mlflow", f"{plan.config.name}/trainer"}
    for repo in repos:
        assert graph[(repo.type, repo.name)]["account"] == "automation"
        assert repo.inputs["imageTagMutability"] == "IMMUTABLE"
        assert repo.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
        assert repo.inputs["encryptionConfigurations"][0]["encryptionType"] == "KMS"
        policy = json.loads(plan.recording.one("aws:ecr/repositoryPolicy:RepositoryPolicy", f"{repo.name}-policy").inputs["policy"])
        (statement,) = policy["Statement"]
        assert statement["Principal"] == {"AWS": [f"arn:aws:iam::{plan.config.accounts.workload.id}:root"]}
        assert not any(a.startswith("ecr:Put") or a == "ecr:*" for a in statement["Action"])


# -- config validation ------------------------------------------------------------------------------
def _problems(raw):
    with pytest.raises(ConfigError) as caught:
        load_platform_config(raw)
    return {p.path: p for p in caught.value.problems}


def test_bad_tracking_config_is_reported_all_at_once():
    raw = stack_config("prod")
    raw["tracking"]["image"] = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-prod/mlflow:latest"
    raw["tracking"]["database"].update({"minCapacityAcu": 8, "maxCapacityAcu": 4, "secondsUntilAutoPause": 60})
    problems = _problems(raw)
    assert "@sha256:" in problems["tracking.image"].fix
    assert problems["tracking.database.minCapacityAcu"].value == 8
    pause = problems["tracking.database.secondsUntilAutoPause"]
    assert pause.value == 60


def test_auto_pause_range_and_dev_tags_are_allowed():
    raw = stack_config("dev")
    assert ":" in raw["tracking"]["image"] and "@sha256:" not in raw["tracking"]["image"]
    load_platform_config(raw)  # dev may run a tag
    raw["tracking"]["database"]["secondsUntilAutoPause"] = 90000
    problem = _problems(raw)["tracking.database.secondsUntilAutoPause"]
    assert "300" in problem.fix and "86400" in problem.fix


def test_internet_facing_needs_listed_cidrs():
    raw = stack_config("prod")
    raw["tracking"]["ingressCidrs"] = []
    assert "ingressCidrs" in _problems(raw)["tracking.ingressCidrs"].path


STATEFUL_TYPES = ("aws:kms/key:Key", "aws:s3/bucket:Bucket", "aws:fsx/lustreFileSystem:LustreFileSystem",
                  "aws:rds/cluster:Cluster", "aws:rds/clusterInstance:ClusterInstance", "aws:ecr/repository:Repository")


def test_stateful_resources_of_datasets_and_tracking_are_protected_in_prod_only(plan):
    prefixes = tuple(f"{plan.config.name}-{part}" for part in ("datasets", "mlflow", "images", "alb-logs"))
    stateful = [r for t in STATEFUL_TYPES for r in plan.recording.by_type(t) if r.name.startswith(prefixes)]
    assert {r.type for r in stateful} == set(STATEFUL_TYPES)
    assert [r.name for r in stateful if r.protect is not plan.config.is_prod] == []
