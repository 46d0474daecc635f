"""A small program run through the real Pulumi CLI with the stand-in plugins, one operation per
process (the Automation API runs an inline program in-process; a fresh process keeps the test's
own Pulumi state out of it).

    python -m tests.engine.standin_cli_program OPERATION   # settings in STANDIN_TEST_* variables

Prints one JSON line: ``{"summary": {...}, "outputs": {...}}`` or ``{"error": "..."}``.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

PROJECT = "standin-cli"
ACCOUNT = "222233334444"


def program() -> None:
    import pulumi
    import pulumi_aws as aws
    import pulumi_eks as eks
    import pulumi_kubernetes as k8s

    phase = int(os.environ.get("STANDIN_TEST_PHASE", "1"))
    if os.environ.get("STANDIN_TEST_PROVIDERLESS_INVOKE"):
        # What `pulumi:disable-default-providers` must stop before any provider sees it.
        pulumi.export("account", aws.get_caller_identity_output().account_id)
        return
    provider = aws.Provider("workload", region="us-west-2", skip_credentials_validation=True,
                            assume_roles=[aws.ProviderAssumeRoleArgs(role_arn=f"arn:aws:iam::{ACCOUNT}:role/deploy")])
    parent = pulumi.ComponentResource("standin:test:Stack", "t", {}, pulumi.ResourceOptions(providers={"aws": provider}))
    child = pulumi.ResourceOptions(parent=parent)
    vpc = aws.ec2.Vpc("vpc", cidr_block="10.0.0.0/16", opts=child)
    # Phase 2 moves the subnet (AWS cannot: a replacement) and retags the role (an update).
    subnet = aws.ec2.Subnet("subnet", vpc_id=vpc.id, availability_zone="us-west-2a",
                            cidr_block="10.0.0.0/20" if phase == 1 else "10.0.16.0/20", opts=child)
    role = aws.iam.Role("role", assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": []}),
                        tags={"phase": str(phase)}, opts=child)
    identity = aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=parent))
    pulumi.export("account", identity.account_id)
    pulumi.export("subnetId", subnet.id)
    pulumi.export("roleArn", role.arn)
    pulumi.export("roleName", role.name)
    if os.environ.get("MLP_STANDIN_KUBECONFIG"):
        cluster = eks.Cluster(
            "eks", name="standin-eks", version="1.32", vpc_id=vpc.id, private_subnet_ids=[subnet.id],
            endpoint_private_access=True, endpoint_public_access=True, public_access_cidrs=["203.0.113.0/24"],
            authentication_mode=eks.AuthenticationMode.API, kubernetes_service_ip_address_range="172.20.0.0/16",
            skip_default_node_group=True, skip_default_security_groups=True, bootstrap_self_managed_addons=False,
            use_default_vpc_cni=True, coredns_addon_options={"enabled": False},
            kube_proxy_addon_options={"enabled": False}, create_oidc_provider=False,
            provider_credential_opts={"role_arn": f"arn:aws:iam::{ACCOUNT}:role/deploy"}, opts=child)
        kubernetes = k8s.Provider("k8s", kubeconfig=cluster.kubeconfig_json, opts=child)
        k8s.core.v1.ConfigMap("probe", metadata={"name": "standin-probe", "namespace": "default"},
                              data={"cluster": "standin-eks"}, opts=pulumi.ResourceOptions(parent=parent, provider=kubernetes))
        pulumi.export("clusterArn", cluster.eks_cluster.arn)
        pulumi.export("endpoint", cluster.eks_cluster.endpoint)
        pulumi.export("oidcIssuer", cluster.oidc_issuer)
        # A component method: the engine sends it to the eks plugin's Call.
        pulumi.export("calledKubeconfig", cluster.get_kubeconfig(role_arn=f"arn:aws:iam::{ACCOUNT}:role/reader"))


def main(operation: str) -> int:
    from pulumi import automation as auto

    env = dict(os.environ)
    command = auto.PulumiCommand(root=env["STANDIN_TEST_PULUMI_ROOT"], skip_version_check=True)
    settings = auto.ProjectSettings(name=PROJECT, runtime="python")
    workspace = auto.LocalWorkspaceOptions(pulumi_command=command, project_settings=settings,
                                           work_dir=env["STANDIN_TEST_WORK_DIR"], env_vars={
                                               "PULUMI_BACKEND_URL": env["PULUMI_BACKEND_URL"],
                                               "PULUMI_CONFIG_PASSPHRASE": env["PULUMI_CONFIG_PASSPHRASE"]})
    stack = auto.create_or_select_stack(stack_name="t", project_name=PROJECT, program=program, opts=workspace)
    stack.set_config("pulumi:disable-default-providers", auto.ConfigValue(value='["aws", "kubernetes"]'))
    try:
        if operation == "up":
            result = stack.up(on_output=lambda line: print(line, file=sys.stderr))
            payload = {"summary": result.summary.resource_changes,
                       "outputs": {key: value.value for key, value in result.outputs.items()}}
        elif operation == "preview":
            result = stack.preview(on_output=lambda line: print(line, file=sys.stderr), diff=True)
            payload = {"summary": result.change_summary}
        elif operation == "refresh":
            result = stack.refresh(on_output=lambda line: print(line, file=sys.stderr))
            payload = {"summary": result.summary.resource_changes}
        elif operation == "destroy":
            result = stack.destroy(on_output=lambda line: print(line, file=sys.stderr))
            payload = {"summary": result.summary.resource_changes}
        elif operation == "export":
            payload = {"deployment": stack.export_stack().deployment}
        else:
            raise SystemExit(f"unknown operation {operation}")
    except auto.errors.CommandError as error:
        payload = {"error": str(error)}
    except Exception:  # noqa: BLE001 - reported to the test whole
        payload = {"error": traceback.format_exc()}
    print(json.dumps(payload, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
