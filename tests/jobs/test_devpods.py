"""The interactive GPU pod (`python -m workloads dev`): one slice of a shared or MIG pool with the
team's identity, mounts and queue, a notebook on its loopback, two clocks that end it; refused and
removed when Kueue does not admit it in time; and port-forward to it, and to nothing else.

The API server's own verdict (Kueue admitting it as the team, refusing it beyond the quota, the
port-forward policy on a real CONNECT) is in tests/cluster/test_dev_pods_live.py.
"""
from __future__ import annotations

import json

import pytest

from jobs.__main__ import main
from jobs.client import JobClient
from jobs.devpods import DevPodRefused, owner_slug
from tests.jobs.conftest import kueue_workload, use_fake_kubectl
from trainer import devserver
from workloads import devpod, tenancy
from workloads.problems import InvalidInputError

NS = "team-research"
IMAGE = "111122223333.dkr.ecr.us-west-2.amazonaws.com/mlp-dev/trainer:1.0.0-dev"


def spec(**changes) -> devpod.DevPodSpec:
    return devpod.DevPodSpec(**{"name": "devpod-alice-1a2b", "team": "research", "image": IMAGE, "owner": "alice",
                                "token_secret": "devpod-alice-1a2b", **changes})


def test_the_dev_pod_is_one_slice_of_a_shared_pool_in_the_teams_queue_with_its_identity(dev_facts):
    job = devpod.render(spec(idle="30m", max_life="4h"), dev_facts)
    team = dev_facts.team("research")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert job["metadata"]["name"].startswith(tenancy.DEV_POD_PREFIX)
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == team.local_queue and job["spec"]["suspend"] is True
    shared = dev_facts.pool("l4-shared")
    assert pod["nodeSelector"]["mlplatform.io/pool"] == shared.name
    assert container["resources"]["requests"] == {**container["resources"]["requests"], "nvidia.com/gpu.shared": "1"}
    assert "nvidia.com/gpu" not in container["resources"]["requests"], "a whole GPU, not a slice"
    assert pod["securityContext"]["runAsUser"] == team.posix_id and pod["serviceAccountName"] == team.trainer_service_account
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert dev_facts.fsx_claim_name in claims  # the team's subtree, as its jobs mount it
    env = {e["name"]: e for e in container["env"]}
    assert env["DEVSERVER_IDLE_SECONDS"]["value"] == "1800" and job["spec"]["activeDeadlineSeconds"] == 4 * 3600
    assert env["JUPYTER_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "devpod-alice-1a2b", "key": "JUPYTER_TOKEN"}
    assert env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"]["name"] == team.tracking_secret
    assert container["command"] == ["python", "-m", "trainer.devserver"]


def test_on_a_mig_pool_it_asks_for_one_mig_slice(prod_plan):
    from jobs.facts import facts_from_plan

    prod = facts_from_plan(prod_plan)
    job = devpod.render(spec(team="applied"), prod)
    requests = job["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["nvidia.com/mig-1g.10gb"] == "1" and job["metadata"]["labels"]["mlplatform.io/pool"] == "h100-mig"


def test_the_rendered_dev_pod_passes_the_team_admission_policies_and_a_bare_copy_does_not(dev_facts):
    """The Job as the team creates it, and its pod as the job controller creates it: admitted. The
    same pod created by the team directly (bypassing Kueue) is refused by the gpu-pods policy."""
    from tests.infra.test_tenant_attacks import JOB_CONTROLLER, NAMESPACES, POLICIES, TEAM_USER, A, UID, admit

    job = devpod.render(spec(), dev_facts)
    job["metadata"]["namespace"] = A
    job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = NAMESPACES[A]["metadata"]["labels"]["kueue.x-k8s.io/local-queue"] \
        if "kueue.x-k8s.io/local-queue" in NAMESPACES[A]["metadata"]["labels"] else job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    template = job["spec"]["template"]["spec"]
    uid = UID[A]
    for ctx in (template["securityContext"], template["containers"][0]["securityContext"]):
        for key in ("runAsUser", "runAsGroup", "fsGroup"):
            if key in ctx:
                ctx[key] = uid
    template["priorityClassName"] = "training-default"
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "devpod-alice-1a2b-x7k2p", "namespace": A,
                                                          "labels": job["spec"]["template"]["metadata"]["labels"]},
           "spec": template}
    assert admit(pod, NAMESPACES[A], JOB_CONTROLLER) == [], "the job controller's pod of the dev Job is refused"
    assert any("gpu-pods" in r for r in admit(pod, NAMESPACES[A], TEAM_USER)), "a bare GPU pod by the team was admitted"


def test_port_forward_is_admitted_to_dev_pods_only_and_only_narrowed_for_team_members():
    """The policy the API server evaluates on CONNECT pods/portforward (request.name: the pod)."""
    import celpy

    (policy,) = [p for p in tenancy.admission_policies() if p["kind"] == "ValidatingAdmissionPolicy"
                 and p["metadata"]["name"].endswith("port-forward")]
    assert policy["spec"]["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods/portforward"], "operations": ["CONNECT"]}]
    env = celpy.Environment()

    def evaluate(expression, name, groups):
        activation = {"request": celpy.json_to_cel({"name": name, "userInfo": {"username": "u", "groups": groups}})}
        return bool(env.program(env.compile(expression)).evaluate(activation))

    (condition,) = policy["spec"]["matchConditions"]
    (rule,) = policy["spec"]["validations"]
    team = [tenancy.team_group("team-research"), "system:authenticated"]
    assert evaluate(condition["expression"], "x", team) and not evaluate(condition["expression"], "x", ["system:masters"])
    assert evaluate(rule["expression"], "devpod-alice-1a2b-x7k2p", team)
    for trainer_pod in ("smoke-l4-master-0", "gpt2-pretrain-worker-3", "dev-alice"):
        assert not evaluate(rule["expression"], trainer_pod, team), trainer_pod
    # The team Role grants the connect; only the policy narrows it.
    rules = [{"apiGroups": [g], "resources": list(r), "verbs": list(v)} for g, r, v in tenancy.TEAM_RULES]
    assert tenancy.rbac_allows(rules, verb="create", group="", resource="pods/portforward")
    for closed in ("pods/exec", "pods/attach", "pods/ephemeralcontainers"):
        assert not tenancy.rbac_allows(rules, verb="create", group="", resource=closed), closed


def test_a_training_job_may_not_take_a_dev_pod_name():
    from workloads.jobspec import parse_job_spec
    from tests.jobs.conftest import raw_spec

    with pytest.raises(InvalidInputError, match="starts with devpod-"):
        parse_job_spec(raw_spec(name="devpod-sneaky"))


@pytest.mark.parametrize("changes, key", [
    ({"idle": "5x"}, "--idle"), ({"max_life": "100h"}, "--max"), ({"idle": "9h", "max_life": "8h"}, "--idle"),
    ({"pool": "l4"}, "--pool"), ({"pool": "nope"}, "--pool"),
])
def test_bad_dev_pod_settings_name_the_flag_and_the_fix(dev_facts, changes, key):
    with pytest.raises(devpod.DevPodError) as refused:
        devpod.render(spec(**changes), dev_facts)
    (line,) = [l for l in str(refused.value).splitlines() if l.strip().startswith(f"- {key}")]
    assert "Fix: " in line


def test_start_creates_the_job_and_its_token_then_waits_for_kueue(kube, dev_facts):
    kube.user, kube.groups = "alice@team-research", (tenancy.team_group(NS),)
    clock = [0.0]

    def kueue(seconds):
        clock[0] += seconds
        job = kube.list("jobs.batch", NS)[0]
        if not kube.list("workloads.kueue.x-k8s.io", NS):
            kueue_workload(kube, job, [{"type": "Admitted", "status": "True"}], flavors={"nvidia.com/gpu.shared": "gpu-l4-shared"})

    client = JobClient(stack="dev", kube=kube, facts=dev_facts, clock=lambda: clock[0], sleep=kueue)
    dev = client.dev_pods.start(image=IMAGE, idle="30m")
    assert dev.admitted and dev.name.startswith("devpod-alice-") and dev.pool == "l4-shared"
    (job,) = kube.list("jobs.batch", NS)
    secret = kube.find("secrets", dev.name, NS)
    assert secret["stringData"]["JUPYTER_TOKEN"] == dev.token and len(dev.token) >= 24
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]  # goes with the Job
    assert dev.url() == f"http://127.0.0.1:8888/lab?token={dev.token}"
    assert [d.name for d in client.dev_pods.list()] == [dev.name]


def test_not_admitted_in_time_is_refused_and_deleted(kube, dev_facts):
    """Kueue keeps it waiting (the team's slices are in use): after --wait the Job is deleted and
    the refusal quotes Kueue. Before: no interactive path at all."""
    kube.user, kube.groups = "alice@team-research", (tenancy.team_group(NS),)
    clock = [0.0]
    reason = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu.shared in flavor gpu-l4-shared"

    def waiting(seconds):
        clock[0] += seconds
        job = kube.list("jobs.batch", NS)[0]
        if not kube.list("workloads.kueue.x-k8s.io", NS):
            kueue_workload(kube, job, [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": reason}])

    client = JobClient(stack="dev", kube=kube, facts=dev_facts, clock=lambda: clock[0], sleep=waiting)
    with pytest.raises(DevPodRefused, match="insufficient unused quota") as refused:
        client.dev_pods.start(image=IMAGE, wait_seconds=30)
    assert "was not admitted within 30 s" in str(refused.value) and "pools --team research" in str(refused.value)
    deletes = [r for r in kube.requests if r[0] == "delete"]
    assert deletes and deletes[-1][1] == "jobs.batch"


def test_bad_flags_through_the_command_line_are_one_line_each_and_create_nothing(kube, dev_facts, tmp_path, monkeypatch,
                                                                                 capsys):
    state = use_fake_kubectl(tmp_path, monkeypatch)
    kube.save(state)
    monkeypatch.setenv("FAKE_KUBE_USER", "alice@team-research")
    monkeypatch.setenv("FAKE_KUBE_GROUPS", f"{tenancy.team_group(NS)},system:authenticated")
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["dev", "--facts", str(facts)]) == 2
    assert capsys.readouterr().err.startswith("error: --image is required")
    assert main(["dev", "--facts", str(facts), "--image", IMAGE, "--idle", "5x", "--pool", "l4"]) == 2
    err = capsys.readouterr().err
    assert "--idle: is not a duration" in err and "--pool: runs whole GPUs" in err
    from tests.jobs.fake_kube import FakeKubeApi

    assert not FakeKubeApi.load(state).list("jobs.batch", NS) and not FakeKubeApi.load(state).list("secrets", NS)


def test_endpoints_name_mlflow_its_login_and_the_dashboards(dev_facts, capsys, tmp_path):
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(dev_facts.to_dict()))
    assert main(["endpoints", "--team", "research", "--facts", str(facts)]) == 0
    out = capsys.readouterr().out
    assert "MLflow:      https://mlflow.dev.ml.example.com" in out
    assert "login:     Secret mlflow-tracking in team-research" in out
    assert "Argo CD:     https://argocd.dev.ml.example.com" in out
    assert "training-job" in out and "kubectl -n team-research get secret mlflow-tracking" in out
    assert "aws eks update-kubeconfig --name mlp-dev-eks" in out


def test_the_notebook_server_listens_on_loopback_and_ends_itself_when_idle(tmp_path):
    argv = devserver.jupyter_argv({"DEVSERVER_PORT": "8888", "DEVSERVER_IDLE_SECONDS": "1800", "DEVSERVER_ROOT": "/fsx/x"})
    assert "--ServerApp.ip=127.0.0.1" in argv and "--ServerApp.shutdown_no_activity_timeout=1800" in argv
    assert "--MappingKernelManager.cull_idle_timeout=1800" in argv and "--MappingKernelManager.cull_connected=True" in argv
    log = tmp_path / "termination-log"
    assert devserver._refuse("no jupyter", str(log)) == 2 and log.read_text() == "no jupyter"


def test_owner_names_are_short_and_dns_safe():
    assert owner_slug("alice@team-research") == "alice"
    assert owner_slug("arn:aws:sts::444455556666:assumed-role/mlp-team-research/Bob.Smith") == "bob-smith"
    assert owner_slug("") == "me"
