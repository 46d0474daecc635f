"""Cross-part invariants (issue 33 item 3) on both stacks' recorded plans; the functions are in
tests/infra/plan_invariants.py, each citing the upstream source of what the plan cannot record.
aws-readiness-4 named a defect for three of them: R1 (dev: FSx's startup taint without FSx), R2
(both: the node-health image had no repository), R3 (prod: the DCGM ServiceMonitor selected the
standalone chart's labels under the GPU Operator). Each would fail here again."""
from __future__ import annotations

import copy

import pytest

from tests.infra import plan_invariants as inv


def test_every_startup_taint_is_lifted_by_something_the_stack_deploys(plan):
    assert inv.unlifted_startup_taints(plan.recording) == []


def test_every_image_has_a_repository_and_build_or_a_pinned_public_source(plan):
    assert inv.images_without_source(plan.recording) == []


def test_every_service_monitor_selects_a_service_the_stack_installs_in_its_mode(plan):
    assert inv.unmatched_monitor_selectors(plan.recording) == []


def test_every_trainer_pod_monitor_matches_the_pods_the_stacks_jobs_render(plan):
    """The stack's rendered jobs (workloads/rendered/<stack>, checked up to date by render --check)."""
    templates = inv.rendered_pod_templates(plan.stack)
    assert templates, "no rendered job in this stack"
    assert inv.unmatched_pod_monitors(plan.recording, templates) == []


def test_a_pod_monitor_for_a_port_no_trainer_names_is_found(prod_plan):
    recording = prod_plan.recording
    resource, obj = next((r, o) for r, o in inv.k8s_objects(recording, "PodMonitor")
                         if o["spec"]["selector"]["matchLabels"] == {"mlplatform.io/trainer-metrics": "true"})
    changed = copy.deepcopy(obj)
    changed["spec"]["podMetricsEndpoints"][0]["port"] = "http-metrics"
    problems = inv.unmatched_pod_monitors(_replaced(recording, resource, changed), inv.rendered_pod_templates("prod"))
    assert len(problems) == 1 and "http-metrics" in problems[0]


# -- each check can fail: the defect planted in a copy of the plan ------------------------------
def _without(recording, predicate):
    from infra.recording import Recording

    return Recording([r for r in recording.resources if not predicate(r)], recording.stack_outputs, recording.aliases)


def _replaced(recording, resource, inputs):
    from infra.recording import Recording

    clone = copy.copy(resource)
    clone.inputs = inputs
    return Recording([clone if r is resource else r for r in recording.resources], recording.stack_outputs,
                     recording.aliases)


def test_a_taint_whose_driver_is_absent_is_found(dev_plan):
    """R1's shape: a NodePool that starts tainted for a CSI driver the stack does not install."""
    recording = _without(dev_plan.recording, lambda r: r.type == "aws:eks/addon:Addon"
                         and r.inputs.get("addonName") == "aws-mountpoint-s3-csi-driver")
    assert any("s3.csi.aws.com/agent-not-ready" in p and "does not deploy" in p
               for p in inv.unlifted_startup_taints(recording))


def test_an_agent_that_does_not_tolerate_a_pool_taint_is_found(prod_plan):
    recording = prod_plan.recording
    resource, obj = next((r, o) for r, o in inv.k8s_objects(recording, "DaemonSet") if o["metadata"]["name"] == "gpu-node-health")
    changed = copy.deepcopy(obj)
    changed["spec"]["template"]["spec"]["tolerations"] = [
        t for t in changed["spec"]["template"]["spec"]["tolerations"] if t["key"] != "mlplatform.io/mig-pending"]
    problems = inv.unlifted_startup_taints(_replaced(recording, resource, changed))
    assert any("gpu-node-health" in p and "mlplatform.io/mig-pending" in p for p in problems)


def test_an_image_without_its_repository_is_found(dev_plan):
    """R2's shape: the node-health DaemonSet pulls from a repository nobody creates."""
    recording = _without(dev_plan.recording, lambda r: r.type.startswith("aws:ecr/") and "node-health" in r.name)
    problems = inv.images_without_source(recording)
    assert any("mlp-dev/node-health" in p and "no ECR repository" in p for p in problems)


def test_an_unpinned_public_image_is_found(dev_plan):
    recording = dev_plan.recording
    resource, obj = next((r, o) for r, o in inv.k8s_objects(recording, "DaemonSet") if o["metadata"]["name"] == "gpu-node-health")
    changed = copy.deepcopy(obj)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/cloud-native/dcgm:latest"
    assert any("dcgm:latest" in p and "pinned" in p for p in inv.images_without_source(_replaced(recording, resource, changed)))


def test_a_selector_for_the_other_modes_service_is_found(prod_plan):
    """R3's shape: in gpu-operator mode, a ServiceMonitor for the standalone chart's labels."""
    recording = prod_plan.recording
    resource, obj = next((r, o) for r, o in inv.k8s_objects(recording, "ServiceMonitor")
                         if o["metadata"]["name"] == "dcgm-exporter")
    changed = copy.deepcopy(obj)
    changed["spec"]["selector"]["matchLabels"] = {"app.kubernetes.io/name": "dcgm-exporter"}
    changed["spec"]["endpoints"][0]["port"] = "metrics"
    problems = inv.unmatched_monitor_selectors(_replaced(recording, resource, changed))
    assert problems == ["ServiceMonitor dcgm-exporter: no Service in ['gpu-system'] has labels "
                        "{'app.kubernetes.io/name': 'dcgm-exporter'} in this stack"]


@pytest.mark.parametrize("taints, taint, expected", [
    ([{"operator": "Exists"}], {"key": "a", "effect": "NoExecute"}, True),
    ([{"key": "a", "operator": "Exists", "effect": "NoSchedule"}], {"key": "a", "effect": "NoExecute"}, False),
    ([{"key": "a", "operator": "Exists"}], {"key": "a", "effect": "NoExecute"}, True),
    ([{"key": "b", "operator": "Exists"}], {"key": "a", "effect": "NoExecute"}, False),
])
def test_toleration_rule(taints, taint, expected):
    assert inv._tolerates(taints, taint) is expected


def test_every_role_ci_assumes_trusts_ci(plan):
    """The workflow assumes <name>-ci-deploy (OIDC; its trust is tested in test_ci_roles.py); from
    it Pulumi assumes each account's role in one hop (infra/accounts.py). The stack grants that
    hop on exactly the three account roles, which the runbook's trust policies must admit
    (aws-readiness-4 B3: only the automation role did)."""
    from components.ci_access import role_name

    arns = inv.assumed_account_roles(plan.recording, role_name(plan.config.name, "deploy"))
    accounts = plan.config.accounts
    assert {accounts.automation.role_arn, accounts.workload.role_arn, accounts.logging.role_arn} <= arns
    runbook = (inv.ROOT / "docs" / "runbooks" / "first-deploy.md").read_text()
    assert inv.roles_not_trusting_ci(runbook) == []


def test_a_runbook_without_ci_in_the_account_trusts_is_found():
    old = ('''**Workload and logging accounts**: trust the automation account's deploy role

```json
{"Version": "2012-10-17", "Statement": [
  {"Effect": "Allow", "Action": "sts:AssumeRole",
   "Principal": {"AWS": "arn:aws:iam::<automation id>:role/mlp-<stack>-pulumi-deploy"}}
]}
```
''')
    assert inv.roles_not_trusting_ci(old) == [
        "no trust policy in the runbook lists role/mlp-<stack>-ci-deploy: CI's assume-role into the account roles is refused"]


# -- every GPU pool can launch: the instance types the cluster tests give Karpenter ---------------
def _gpu_pools(recording):
    return [obj for _, obj in inv.k8s_objects(recording, "NodePool")
            if any(r["key"].startswith("karpenter.k8s.aws/instance-gpu") for r in obj["spec"]["template"]["spec"]["requirements"])]


def test_every_gpu_pool_has_a_catalog_instance_type_that_meets_its_requirements(plan):
    """A NodePool whose requirements no EC2 type meets is one Karpenter never launches a node for;
    the catalog's types (with the AWS provider's labels) are the ones the kwok provider launches
    in tests/cluster (tools/cluster/aws.py)."""
    from tools.cluster.aws import catalog_instance_types, unlaunchable_pools

    pools = _gpu_pools(plan.recording)
    assert pools, f"{plan.stack} has no GPU pool"
    assert unlaunchable_pools(pools, catalog_instance_types()) == []


def test_a_gpu_pool_no_catalog_type_meets_is_found(dev_plan):
    from tools.cluster.aws import catalog_instance_types, unlaunchable_pools

    pool = copy.deepcopy(_gpu_pools(dev_plan.recording)[0])
    for requirement in pool["spec"]["template"]["spec"]["requirements"]:
        if requirement["key"] == "karpenter.k8s.aws/instance-gpu-count":
            requirement["values"] = ["3"]
    problems = unlaunchable_pools([pool], catalog_instance_types())
    assert len(problems) == 1 and pool["metadata"]["name"] in problems[0], problems
