"""Tracking capability: Aurora Serverless v2, Fargate service, HTTPS ALBs, ECR, secrets, config rules."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.mlflow_server import (
    BOOTSTRAP_SECRET_ENV_NAMES,
    HEALTH_CHECK_PATH,
    SECRET_ENV_NAMES,
    MlflowServerSettings,
    mlflow_bootstrap_command,
    mlflow_server_command,
)
from components.tracking import ROTATION_EXCEPTION_PREFIX, ROTATION_EXCEPTIONS, team_tracking_secret
from catalog.versions import AURORA_POSTGRESQL_VERSION, SECRETS_MANAGER_POSTGRES_ROTATION_APP
from infra import plan as plan_module
from infra.config import load_platform_config
from tests.conftest import problem_per_path, stack_config

SG_IN = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
# ELB policies that allow only TLS 1.2 and 1.3 (the API default, ELBSecurityPolicy-2016-08, allows 1.0).
TLS12_PLUS_POLICIES = {"ELBSecurityPolicy-TLS13-1-2-2021-06", "ELBSecurityPolicy-TLS13-1-2-Res-2021-06",
                       "ELBSecurityPolicy-TLS13-1-3-2021-06", "ELBSecurityPolicy-TLS13-1-2-Ext1-2021-06"}


def _name(plan, suffix):
    return f"{plan.config.name}-mlflow-{suffix}"


def _containers(plan):
    task = plan.recording.one("aws:ecs/taskDefinition:TaskDefinition")
    return task, {c["name"]: c for c in json.loads(task.inputs["containerDefinitions"])}


def _container(plan):
    task, containers = _containers(plan)
    return task, containers["mlflow"]


def _master_secret_arn(plan):
    return plan.recording.one("aws:rds/cluster:Cluster").outputs["masterUserSecrets"][0]["secretArn"]


def _policy_statements(plan, role_name):
    role = plan.recording.one("aws:iam/role:Role", _name(plan, role_name))
    return [st for p in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy") if p.inputs["role"] == role.id
            for st in json.loads(p.inputs["policy"])["Statement"]]


def _resources(statement):
    resources = statement["Resource"]
    return resources if isinstance(resources, list) else [resources]


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


def test_database_admits_postgres_from_the_mlflow_service_and_its_rotation_function_only(plan):
    db_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", _name(plan, "db-sg"))
    service_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", _name(plan, "service-sg"))
    rotation_sg = plan.recording.one("aws:ec2/securityGroup:SecurityGroup", _name(plan, "db-rotation-sg"))
    assert plan.recording.one("aws:rds/cluster:Cluster").inputs["vpcSecurityGroupIds"] == [db_sg.id]
    assert not db_sg.inputs.get("ingress") and not db_sg.inputs.get("egress")
    rules = [r.inputs for r in plan.recording.by_type(SG_IN) if r.inputs["securityGroupId"] == db_sg.id]
    assert sorted(r["referencedSecurityGroupId"] for r in rules) == sorted([service_sg.id, rotation_sg.id])
    assert all((r["fromPort"], r["toPort"], r["ipProtocol"]) == (5432, 5432, "tcp") and "cidrIpv4" not in r
               for r in rules)
    # The rotation function reaches the database and the Secrets Manager API (443), nothing else.
    rotation_out = [r.inputs for r in plan.recording.by_type("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
                    if r.inputs["securityGroupId"] == rotation_sg.id]
    assert sorted((r["fromPort"], r.get("referencedSecurityGroupId", r.get("cidrIpv4"))) for r in rotation_out) == sorted(
        [(443, "0.0.0.0/0"), (5432, db_sg.id)])


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
    app_secret = plan.recording.one("aws:secretsmanager/secret:Secret", _name(plan, "db-app"))
    team_secrets = {ns: plan.recording.one("aws:secretsmanager/secret:Secret", _name(plan, f"user-{ns}")).outputs["arn"]
                    for ns in plan.config.team_namespaces}
    settings = MlflowServerSettings(
        artifacts_destination=f"s3://{bucket}/artifacts", allowed_hosts=[plan.config.tracking.domain_name],
        database_host=db.outputs["endpoint"], num_workers=plan.config.tracking.num_workers,
        database_secret_id=app_secret.outputs["arn"], team_secret_ids=team_secrets)
    expected_command, expected_env = mlflow_server_command(settings)
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
    # No secret value in the plain environment.
    assert not set(expected_env) & set(SECRET_ENV_NAMES)
    bootstrap = _containers(plan)[1]["db-bootstrap"]
    bootstrap_command, bootstrap_env = mlflow_bootstrap_command(settings)
    assert bootstrap["command"] == bootstrap_command
    assert {e["name"]: e["value"] for e in bootstrap["environment"]} == bootstrap_env
    assert {s["name"] for s in bootstrap["secrets"]} == set(BOOTSTRAP_SECRET_ENV_NAMES)
    assert task.inputs["networkMode"] == "awsvpc" and task.inputs["requiresCompatibilities"] == ["FARGATE"]


def test_prod_image_is_digest_pinned(prod_plan):
    assert all("@sha256:" in c["image"] for c in _containers(prod_plan)[1].values())


def test_roles_are_separate_and_least_privilege(plan):
    task = plan.recording.one("aws:ecs/taskDefinition:TaskDefinition").inputs
    execution = plan.recording.one("aws:iam/role:Role", _name(plan, "execution"))
    task_role = plan.recording.one("aws:iam/role:Role", _name(plan, "task"))
    assert task["executionRoleArn"] == execution.outputs["arn"] != task["taskRoleArn"] == task_role.outputs["arn"]
    policies = {p.name: json.loads(p.inputs["policy"]) for p in plan.recording.by_type("aws:iam/rolePolicy:RolePolicy")
                if p.inputs["role"] in (execution.id, task_role.id)}
    execution_policy = policies[_name(plan, "execution-policy")]
    secret_reads = [s for s in execution_policy["Statement"] if s["Action"] == "secretsmanager:GetSecretValue"]
    # Exactly the secrets the containers reference (ECS resolves them at task start).
    referenced = {s["valueFrom"].split(":password::")[0].split(":username::")[0]
                  for c in _containers(plan)[1].values() for s in c["secrets"]}
    assert len(secret_reads) == 1 and set(secret_reads[0]["Resource"]) == referenced
    artifacts_policy = policies[f"{_name(plan, 'artifacts')}-read-write-{_name(plan, 'task')}"]
    bucket_arn = plan.recording.one("aws:s3/bucket:Bucket", _name(plan, "artifacts-bucket")).outputs["arn"]
    resources = {r for s in artifacts_policy["Statement"] for r in s["Resource"]}
    assert bucket_arn in resources and all(r.startswith(bucket_arn) or ":kms:" in r for r in resources)
    # The artifacts grant reads no secrets, the execution role touches no artifacts.
    assert not any("secretsmanager" in str(s["Action"]) for s in artifacts_policy["Statement"])
    assert not any("s3:" in str(s["Action"]) for s in execution_policy["Statement"])
    # security-4 / audit-3 L4: a stolen execution-role session calls kms:Decrypt itself (no
    # kms:ViaService in the request context): no statement allows it; ECS resolving the secrets
    # through Secrets Manager still can.
    region = plan.config.region

    def decrypt_allowed(context: dict) -> bool:
        return any(s["Action"] == "kms:Decrypt" and all(context.get(k) == v for k, v in
                   s.get("Condition", {}).get("StringEquals", {}).items()) for s in execution_policy["Statement"])

    assert not decrypt_allowed({})
    assert decrypt_allowed({"kms:ViaService": f"secretsmanager.{region}.amazonaws.com"})


def test_flask_key_admin_password_and_database_password_never_enter_the_state(plan):
    versions = {v.name: v.inputs for v in plan.recording.by_type("aws:secretsmanager/secretVersion:SecretVersion")}
    for secret in ("flask-secret-key", "admin-password", "db-app"):
        value = versions[_name(plan, f"{secret}-value")]
        assert "secretString" not in value and value["secretStringWoVersion"] == 1, secret


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
    assert namespaces == set(plan.config.team_namespaces)


def test_prod_is_internal_only_and_admits_the_vpc_and_listed_cidrs(prod_plan, dev_plan):
    """The prod MLflow login is never on the internet (issue 18 item 8): one internal ALB in the
    private subnets, admitting the VPC and the listed VPN client range."""
    lbs = prod_plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer")
    assert [lb.name for lb in lbs if not lb.inputs["internal"]] == []
    private_ids = sorted(s.id for s in prod_plan.recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in s.name)
    assert all(sorted(lb.inputs["subnets"]) == private_ids for lb in lbs if "mlflow" in lb.name)
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
    # node-health: the GPU readiness agent (both stacks have GPU pools; aws-readiness-4 R2).
    assert {r.inputs["name"] for r in repos} == {f"{plan.config.name}/mlflow", f"{plan.config.name}/trainer",
                                                 f"{plan.config.name}/node-health"}
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


def test_bad_tracking_config_is_reported_all_at_once():
    raw = stack_config("prod")
    raw["tracking"]["image"] = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-prod/mlflow:latest"
    raw["tracking"]["database"].update({"minCapacityAcu": 8, "maxCapacityAcu": 4, "secondsUntilAutoPause": 60})
    problems = problem_per_path(raw)
    assert "@sha256:" in problems["tracking.image"].fix
    assert problems["tracking.database.minCapacityAcu"].value == 8
    pause = problems["tracking.database.secondsUntilAutoPause"]
    assert pause.value == 60


def test_auto_pause_range_and_dev_tags_are_allowed():
    raw = stack_config("dev")
    assert ":" in raw["tracking"]["image"] and "@sha256:" not in raw["tracking"]["image"]
    load_platform_config(raw)  # dev may run a tag
    raw["tracking"]["database"]["secondsUntilAutoPause"] = 90000
    problem = problem_per_path(raw)["tracking.database.secondsUntilAutoPause"]
    assert "300" in problem.fix and "86400" in problem.fix


def test_internet_facing_needs_listed_cidrs():
    raw = stack_config("dev")
    raw["tracking"]["loadBalancerScheme"] = "internet-facing"
    raw["tracking"]["ingressCidrs"] = []
    assert "ingressCidrs" in problem_per_path(raw)["tracking.ingressCidrs"].path


STATEFUL_TYPES = ("aws:kms/key:Key", "aws:s3/bucket:Bucket", "aws:fsx/lustreFileSystem:LustreFileSystem",
                  "aws:rds/cluster:Cluster", "aws:rds/clusterInstance:ClusterInstance", "aws:ecr/repository:Repository")


def test_stateful_resources_of_datasets_and_tracking_are_protected_in_prod_only(plan):
    prefixes = tuple(f"{plan.config.name}-{part}" for part in ("datasets", "mlflow", "images", "alb-logs"))
    # The shared file system: FSx for Lustre, or EFS with datasets storage s3-mountpoint (dev).
    file_system = ("aws:fsx/lustreFileSystem:LustreFileSystem" if plan.config.datasets.fsx is not None
                   else "aws:efs/fileSystem:FileSystem")
    types = {t for t in STATEFUL_TYPES if t != "aws:fsx/lustreFileSystem:LustreFileSystem"} | {file_system}
    stateful = [r for t in types for r in plan.recording.by_type(t) if r.name.startswith(prefixes)]
    assert {r.type for r in stateful} == types
    assert [r.name for r in stateful if r.protect is not plan.config.is_prod] == []


# -- database users and secrets (issue 8 item 11, issue 9 item 5) ------------------------------------
def test_the_server_never_gets_the_rds_master_secret_only_the_one_off_bootstrap_does(plan):
    master = _master_secret_arn(plan)
    _, containers = _containers(plan)
    server, bootstrap = containers["mlflow"], containers["db-bootstrap"]
    # The long-running server: neither its environment nor its secrets reference the master secret.
    assert master not in json.dumps(server)
    # Its runtime identity (the task role) cannot read it either, nor any secret by wildcard.
    for statement in _policy_statements(plan, "task"):
        if "secretsmanager" in str(statement["Action"]):
            assert master not in _resources(statement) and "*" not in _resources(statement)
    # Only the bootstrap container gets it, and it runs to completion before the server starts.
    assert {s["valueFrom"] for s in bootstrap["secrets"]} >= {f"{master}:username::", f"{master}:password::"}
    assert bootstrap["essential"] is False
    assert server["dependsOn"] == [{"containerName": "db-bootstrap", "condition": "SUCCESS"}]
    assert bootstrap["image"] == server["image"]


def test_the_servers_database_user_is_not_the_master_user_and_its_password_rotates(plan):
    db = plan.recording.one("aws:rds/cluster:Cluster")
    server_env = {e["name"]: e["value"] for e in _container(plan)[1]["environment"]}
    assert server_env["MLFLOW_DB_USERNAME"] != db.inputs["masterUsername"]
    app_secret = plan.recording.one("aws:secretsmanager/secret:Secret", _name(plan, "db-app"))
    assert server_env["MLFLOW_DB_SECRET_ID"] == app_secret.outputs["arn"]
    # The server reads that secret at run time (rotation), so its task role may.
    task_reads = {r for st in _policy_statements(plan, "task") if st["Action"] == "secretsmanager:GetSecretValue"
                  for r in _resources(st)}
    assert app_secret.outputs["arn"] in task_reads
    # Rotated by AWS's single-user PostgreSQL function, on the configured schedule, not at creation
    # (the user exists only once the first task has bootstrapped it).
    rotation = plan.recording.one("aws:secretsmanager/secretRotation:SecretRotation")
    assert rotation.inputs["secretId"] == app_secret.id
    assert rotation.inputs["rotationRules"] == {
        "automaticallyAfterDays": plan.config.tracking.database.password_rotation_days}
    assert rotation.inputs["rotateImmediately"] is False
    app = plan.recording.one("aws:serverlessrepository/cloudFormationStack:CloudFormationStack")
    assert (app.inputs["applicationId"], app.inputs["semanticVersion"]) == SECRETS_MANAGER_POSTGRES_ROTATION_APP["aws"]
    assert app.inputs["applicationId"].endswith("/SecretsManagerRDSPostgreSQLRotationSingleUser")
    assert rotation.inputs["rotationLambdaArn"] == app.outputs["outputs"]["RotationLambdaARN"]
    params = app.inputs["parameters"]
    assert params["kmsKeyArn"] == plan.recording.one("aws:kms/key:Key", _name(plan, "tracking-key")).outputs["arn"]
    private_ids = sorted(s.id for s in plan.recording.by_type("aws:ec2/subnet:Subnet") if "-private-" in s.name)
    assert sorted(params["vpcSubnetIds"].split(",")) == private_ids
    # The secret's shape is what the rotation function reads.
    version = plan.recording.one("aws:secretsmanager/secretVersion:SecretVersion", _name(plan, "db-app-value"))
    assert version.inputs["secretStringWo"] == "[secret]" or set(json.loads(version.inputs["secretStringWo"])) >= {
        "engine", "host", "username", "password", "dbname", "port"}


def test_every_tracking_secret_rotates_or_states_its_exception_in_the_secret_and_the_plan(plan):
    secrets = [s for s in plan.recording.by_type("aws:secretsmanager/secret:Secret") if s.name.startswith(_name(plan, ""))]
    rotated = {r.inputs["secretId"] for r in plan.recording.by_type("aws:secretsmanager/secretRotation:SecretRotation")}
    exceptions = [s for s in secrets if s.id not in rotated]
    assert exceptions and len(exceptions) < len(secrets)
    for secret in exceptions:
        description = secret.inputs.get("description", "")
        assert ROTATION_EXCEPTION_PREFIX in description, secret.name
        assert any(reason in description for reason in ROTATION_EXCEPTIONS.values()), secret.name
    section = dict(plan.sections)["Tracking"]
    for name, reason in ROTATION_EXCEPTIONS.items():
        assert any(name in line and "NOT ROTATED" in line and reason in line for line in section), name
    assert any("without automatic rotation" in w and "written exceptions" in w for w in plan.warnings)


def test_each_team_namespace_gets_only_its_own_mlflow_login(plan):
    namespaces = plan.config.team_namespaces
    assert namespaces
    server_env = {e["name"]: e["value"] for e in _container(plan)[1]["environment"]}
    team_secret_ids = json.loads(server_env["MLFLOW_TEAM_SECRET_IDS"])
    assert set(team_secret_ids) == set(namespaces)
    admin_secret = plan.recording.one("aws:secretsmanager/secret:Secret", _name(plan, "admin-password"))
    for secret in plan.recording.by_type("kubernetes:core/v1:Secret"):
        if secret.inputs["metadata"]["name"] != "mlflow-tracking":
            continue
        namespace = secret.inputs["metadata"]["namespace"]
        # The provider makes stringData and data secret: the login is named by an annotation.
        assert secret.inputs["stringData"] == secret.inputs["data"] == "[secret]"
        user = secret.inputs["metadata"]["annotations"]["mlplatform.io/mlflow-user"]
        assert user == namespace != plan.config.tracking.admin_username
        # ... whose password the server syncs from that team's own secret.
        team_secret = plan.recording.one("aws:secretsmanager/secret:Secret", _name(plan, f"user-{namespace}"))
        assert team_secret_ids[user] == team_secret.outputs["arn"] != admin_secret.outputs["arn"]
        version = plan.recording.one("aws:secretsmanager/secretVersion:SecretVersion", _name(plan, f"user-{namespace}-value"))
        assert version.inputs["secretId"] == team_secret.id


# -- Aurora engine version (issue 8 item 13) ---------------------------------------------------------
# AWS: the minimum Aurora PostgreSQL versions whose Serverless v2 instances can scale to 0 ACU
# (https://docs.aws.amazon.com/AmazonRDS/latest/AuroraUserGuide/aurora-serverless-v2-auto-pause.html,
# "Aurora Serverless v2 capacity"; AWS launch blog "Introducing scaling to 0 capacity with Amazon
# Aurora Serverless v2"): 13.15, 14.12, 15.7, 16.3 and later; 17.4 is the first Aurora 17.
ZERO_ACU_MINIMUM = {13: (13, 15), 14: (14, 12), 15: (15, 7), 16: (16, 3), 17: (17, 4)}


def test_aurora_keeps_what_aws_upgrades_and_starts_at_a_version_that_can_pause(plan):
    db = plan.recording.one("aws:rds/cluster:Cluster")
    # Minor upgrades are AWS's: on for the cluster and every instance; the instances carry no
    # engine version of their own that a later `up` could hold back.
    assert db.inputs["autoMinorVersionUpgrade"] is True
    for instance in plan.recording.by_type("aws:rds/clusterInstance:ClusterInstance"):
        assert "engineVersion" not in instance.inputs
        assert instance.inputs.get("autoMinorVersionUpgrade", True) is True
    major, minor = (int(x) for x in db.inputs["engineVersion"].split(".")[:2])
    if plan.config.tracking.database.min_capacity_acu == 0:
        assert (major, minor) >= ZERO_ACU_MINIMUM[major]


# -- first deploy order (issue 8 item 12) -------------------------------------------------------------
def test_without_an_image_the_service_waits_and_the_plan_says_what_to_do(plan_config):
    raw = stack_config("dev")
    del raw["tracking"]["image"]
    plan = plan_config("dev", raw)
    assert not plan.recording.by_type("aws:ecs/service:Service")
    assert not plan.recording.by_type("aws:ecs/taskDefinition:TaskDefinition")
    repo = plan.recording.one("aws:ecr/repository:Repository", f"{plan.config.name}-images-mlflow")
    (warning,) = [w for w in plan.warnings if "tracking.image is not set" in w]
    assert repo.inputs["name"] in warning and "docker/mlflow" in warning
    # The rest of tracking (database, load balancers, team logins) is there for the second up.
    assert plan.recording.by_type("aws:rds/cluster:Cluster") and plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer")


def test_a_service_is_only_planned_with_an_image(plan):
    assert plan.config.tracking.image is not None
    service = plan.recording.one("aws:ecs/service:Service")
    assert service.inputs["taskDefinition"] == plan.recording.one("aws:ecs/taskDefinition:TaskDefinition").outputs["arn"]
    assert not [w for w in plan.warnings if "tracking.image is not set" in w]


# -- ALB access logs (issue 8 item 7, second half) -----------------------------------------------------
def test_load_balancers_depend_on_the_bucket_policy_that_admits_log_delivery(plan):
    bucket = plan.recording.one("aws:s3/bucket:Bucket", f"{plan.config.name}-alb-logs-bucket")
    policy = plan.recording.one("aws:s3/bucketPolicy:BucketPolicy", f"{plan.config.name}-alb-logs-policy")
    assert policy.inputs["bucket"] == bucket.id
    document = json.loads(policy.inputs["policy"])
    lbs = plan.recording.by_type("aws:lb/loadBalancer:LoadBalancer")
    for lb in lbs:
        logs = lb.inputs["accessLogs"]
        assert logs["bucket"] == bucket.outputs["bucket"] and logs["enabled"] is True
        assert policy.urn in lb.dependencies, lb.name
        # ELB writes <bucket>/<prefix>/AWSLogs/<account-id>/...: some PutObject grant covers it.
        account = plan.config.accounts.workload.id
        key = f"{bucket.outputs['arn']}/{logs['prefix']}/AWSLogs/{account}/elasticloadbalancing/x.log.gz"
        assert any(st["Effect"] == "Allow" and st["Action"] == "s3:PutObject"
                   and any(_arn_like(key, r) for r in _resources(st)) for st in document["Statement"])
    assert lbs


def _arn_like(value: str, pattern: str) -> bool:
    import fnmatch

    return fnmatch.fnmatchcase(value, pattern)


def test_the_tracking_secret_has_exactly_the_keys_the_training_job_renderer_reads():
    manifest = team_tracking_secret("team-a", "https://mlflow.example.com", "cGFzcw==")
    assert manifest["metadata"]["name"] == "mlflow-tracking" and manifest["metadata"]["namespace"] == "team-a"
    assert manifest["metadata"]["annotations"] == {"mlplatform.io/mlflow-user": "team-a"}
    assert set(manifest["stringData"]) | set(manifest["data"]) == {
        "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"}
    assert manifest["stringData"]["MLFLOW_TRACKING_USERNAME"] == "team-a"
    assert manifest["data"] == {"MLFLOW_TRACKING_PASSWORD": "cGFzcw=="}


def _alb_log_writers(plan):
    policy = plan.recording.one("aws:s3/bucketPolicy:BucketPolicy", f"{plan.config.name}-alb-logs-policy")
    return [st["Principal"] for st in json.loads(policy.inputs["policy"])["Statement"]
            if st["Effect"] == "Allow" and st["Action"] == "s3:PutObject"]


def test_alb_log_delivery_principal_follows_the_region(plan_config, dev_plan):
    # us-west-2 (before August 2022): the regional ELB account; the service principal as well.
    assert {json.dumps(p, sort_keys=True) for p in _alb_log_writers(dev_plan)} >= {
        json.dumps({"Service": "logdelivery.elasticloadbalancing.amazonaws.com"})}
    assert any("AWS" in p for p in _alb_log_writers(dev_plan))
    # eu-central-2 (November 2022): only the service principal; the ELB-account lookup, which
    # fails there with "Unknown region", is not made.
    raw = stack_config("dev")
    raw["region"] = "eu-central-2"
    raw["network"]["availabilityZones"] = [f"eu-central-2{z}" for z in "abc"][:len(raw["network"]["availabilityZones"])]
    plan = plan_config("dev", raw)
    assert _alb_log_writers(plan) == [{"Service": "logdelivery.elasticloadbalancing.amazonaws.com"}]


# -- the server's credential hook and entrypoint helpers (pure parts; the integration test runs them for real) --
def _docker_module(name):
    import importlib
    import sys

    path = str(Path(__file__).resolve().parents[2] / "docker" / "mlflow")
    if path not in sys.path:
        sys.path.insert(0, path)
    return importlib.import_module(name)


class _AuthFailed(Exception):
    sqlstate = "28P01"


class _FakeDialect:
    class loaded_dbapi:  # noqa: N801 - mirrors SQLAlchemy's attribute
        Error = Exception

    def __init__(self, accepted):
        self.accepted = accepted
        self.tried = []

    def connect(self, *cargs, **cparams):
        self.tried.append(cparams["password"])
        if cparams["password"] != self.accepted:
            raise _AuthFailed("password authentication failed for user")
        return "connection"


def test_connection_hook_recovers_through_the_pending_version_and_leaves_other_logins_alone(monkeypatch):
    credentials = _docker_module("mlflow_db_credentials")
    stages = {"AWSCURRENT": "old", "AWSPENDING": "new"}
    calls = []

    def fetch(secret_id, stage):
        calls.append(stage)
        return stages.get(stage)

    password = credentials.SecretPassword("arn:aws:secretsmanager:us-west-2:1:secret:x", fetch=fetch)
    hook = credentials.connect_hook("mlflow_app", password)
    dialect = _FakeDialect(accepted="old")
    assert hook(dialect, None, [], {"user": "mlflow_app", "host": "db"}) == "connection"
    assert calls == ["AWSCURRENT"]  # cached from now on
    # The database now has the pending password (rotation half-way). Right after a read, a
    # failure does not trigger another one (a burst of failing requests reads once)...
    dialect.accepted = "new"
    with pytest.raises(_AuthFailed):
        hook(dialect, None, [], {"user": "mlflow_app", "host": "db"})
    assert calls == ["AWSCURRENT"]
    # ... later it does, and finds the pending version.
    monkeypatch.setattr(credentials, "REFRESH_MIN_INTERVAL_SECONDS", 0.0)
    assert hook(dialect, None, [], {"user": "mlflow_app", "host": "db"}) == "connection"
    assert calls == ["AWSCURRENT", "AWSCURRENT", "AWSPENDING"]
    assert dialect.tried[-2:] == ["old", "new"] and password.current() == "new"
    # Another user, or a URL with its own password: SQLAlchemy's default connect.
    assert hook(dialect, None, [], {"user": "someone_else"}) is None
    assert hook(dialect, None, [], {"user": "mlflow_app", "password": "given"}) is None


def test_connection_hook_raises_other_errors_and_gives_up_when_no_version_works():
    credentials = _docker_module("mlflow_db_credentials")
    password = credentials.SecretPassword("s", fetch=lambda secret_id, stage: {"AWSCURRENT": "a"}.get(stage))
    hook = credentials.connect_hook("mlflow_app", password)
    with pytest.raises(_AuthFailed):
        hook(_FakeDialect(accepted="zzz"), None, [], {"user": "mlflow_app"})

    class Down(_FakeDialect):
        def connect(self, *cargs, **cparams):
            raise OSError("connection refused")

    with pytest.raises(OSError):
        hook(Down(accepted="a"), None, [], {"user": "mlflow_app"})


def test_the_server_uri_and_auth_config_carry_no_password():
    entrypoint = _docker_module("mlflow_entrypoint")
    env = {"MLFLOW_DB_HOST": "db.example", "MLFLOW_DB_NAME": "mlflow", "MLFLOW_DB_USERNAME": "mlflow_app",
           "MLFLOW_DB_SECRET_ID": "arn", "MLFLOW_AUTH_DEFAULT_PERMISSION": "NO_PERMISSIONS"}
    uri = entrypoint.database_uri(env)
    assert uri == "postgresql://mlflow_app@db.example:5432/mlflow?sslmode=require"
    config = entrypoint.auth_config(env, uri)
    assert "default_permission = NO_PERMISSIONS" in config and "database_uri = " + uri in config
    assert "authorization_function = mlflow_team_auth:authenticate_request" in config
    with pytest.raises(RuntimeError, match="empty"):
        entrypoint.read_team_secrets({"team-a": "arn:a"}, fetch=lambda secret_id: "")
    assert entrypoint.read_team_secrets({"team-a": "arn:a"}, fetch=lambda secret_id: "pw") == {"team-a": "pw"}
