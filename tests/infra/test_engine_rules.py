"""The recording engine is at least as strict as the real one (issue 33, item 2; audit 4, B1 and B2).

Each rule is quoted from pulumi/pulumi at commit 1b5949891b3cefcb9974752b24a5ecef0acc86c8 (HEAD of
2026-08-21, after v3.259.0; the SDK quotes are the installed pulumi 3.272.0 Python SDK, the same
code), proved on a deliberately broken tiny program, and checked on both stacks.
"""
from __future__ import annotations

import os
from pathlib import Path

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s
import pytest

from infra.plan import read_project, render_second_up, second_up_of
from infra.plan.mock_engine import EngineRefusal, denied_default_providers, run_recorded
from infra.plan.second_up import apply_ignore_changes, compare, parse_path
from infra.plan.urns import diff, stack_urns

ROOT = Path(__file__).resolve().parents[2]
DENY = {"pulumi:disable-default-providers": '["aws","kubernetes"]'}


def record(program, config=None, **options):
    return run_recorded(program, project="p", stack="s", config=dict(DENY if config is None else config), **options)


def refusal(program, config=None, **options) -> str:
    with pytest.raises(EngineRefusal) as caught:
        record(program, config, **options)
    return str(caught.value)


def aws_provider(name: str = "workload") -> aws.Provider:
    return aws.Provider(name, region="us-west-2", allowed_account_ids=["111111111111"])


# -- rule 1: a disabled default provider is refused ------------------------------------------
def test_an_invoke_without_a_provider_is_refused_when_its_default_provider_is_disabled():
    """B1. pkg/resource/deploy/source_eval.go getProviderFromSource:
    ``} else if sdkproviders.IsDenyDefaultsProvider(providerRef) {
        msg := diag.GetDefaultProviderDenied("Invoke").Message``;
    sdk/go/common/diag/errors.go: ``Default provider for '%v' disabled. '%v' must use an explicit provider.``"""
    def program():
        pulumi.export("partition", aws.get_partition_output().partition)

    message = refusal(program)
    assert ("invoke aws:index/getPartition:getPartition: Default provider for 'aws' disabled. "
            "'aws:index/getPartition:getPartition' must use an explicit provider") in message
    assert "FIX: pass opts=pulumi.InvokeOutputOptions(provider=" in message
    # With the package not disabled, the same program runs (the default provider is allowed).
    assert record(program, config={}).stack_outputs["partition"] == "aws"


def test_a_resource_or_remote_component_without_a_provider_is_refused_every_one_at_once(tmp_path):
    """pkg/resource/deploy/step_generator.go loadResourceProvider: ``if sdkproviders.IsDenyDefaultsProvider(ref) {
    ... return nil, sg.bailDiag(diag.GetDefaultProviderDenied(urn), pkg, urn)``; source_eval.go
    RegisterResource, remote: ``if sdkproviders.IsDenyDefaultsProvider(providerRef) {
    msg := diag.GetDefaultProviderDenied("").Message``."""
    (tmp_path / "overlay").mkdir()

    def program():
        aws.s3.Bucket("logs")
        k8s.core.v1.Namespace("team")
        k8s.kustomize.v2.Directory("operator", directory=str(tmp_path / "overlay"))
        aws.s3.Bucket("fine", opts=pulumi.ResourceOptions(provider=aws_provider()))

    message = refusal(program)
    assert "resource aws:s3/bucket:Bucket 'logs': Default provider for 'aws' disabled." in message
    assert "resource kubernetes:core/v1:Namespace 'team': Default provider for 'kubernetes' disabled." in message
    assert "resource kubernetes:kustomize/v2:Directory 'operator'" in message
    assert "'fine'" not in message and "(3 problems)" in message


def test_reading_an_existing_resource_without_a_provider_is_refused():
    """source_eval.go ReadResource: ``} else if sdkproviders.IsDenyDefaultsProvider(ref) {
    msg := diag.GetDefaultProviderDenied("Read").Message``."""
    def program(opts):
        def run():
            aws.s3.Bucket.get("imported", "an-existing-bucket", opts=opts())
        return run

    assert "read aws:s3/bucket:Bucket 'imported': Default provider for 'aws' disabled." in refusal(
        program(lambda: None))
    record(program(lambda: pulumi.ResourceOptions(provider=aws_provider())))


def test_the_disabled_list_is_parsed_as_the_engine_parses_it():
    """pkg/resource/deploy/default_providers.go shouldDenyRequest: ``if value.AsString() == "" {``
    -> allowed; ``barred := strings.TrimSpace(s)``; ``if barred == "*" || barred == req.Package().Name().String()``;
    ``if req.Package().Name().String() == "pulumi" {`` -> always allowed."""
    assert denied_default_providers({"pulumi:disable-default-providers": ""}) == frozenset()
    assert denied_default_providers({"pulumi:disable-default-providers": '[" aws "]'}) == {"aws"}
    with pytest.raises(EngineRefusal, match=r"disable-default-providers\[1\] must be a string"):
        denied_default_providers({"pulumi:disable-default-providers": '["aws", 2]'})

    def program():
        aws.s3.Bucket("b", opts=pulumi.ResourceOptions(provider=aws_provider()))
        pulumi.export("region", aws.get_region_output().region)

    message = refusal(program, config={"pulumi:disable-default-providers": '["*"]'})
    assert "invoke aws:index/getRegion:getRegion" in message and "'b'" not in message


def test_the_offline_plan_exits_1_naming_what_the_engine_would_refuse(monkeypatch, capsys):
    """`python -m infra.plan` runs the program with Pulumi.yaml's config (`pulumi:disable-default-providers:
    value: [aws, kubernetes]`), as the CLI passes it: a broken program is a clear error, no traceback."""
    import infra.plan
    from infra.plan import main

    monkeypatch.setattr(infra.plan.program, "main", lambda: aws.get_caller_identity_output())
    assert main(["--stack", "dev"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the Pulumi engine would refuse this program (1 problem):")
    assert "invoke aws:index/getCallerIdentity:getCallerIdentity: Default provider for 'aws' disabled." in err
    assert "Traceback" not in err


# -- rule 2: providers are inherited through `parent`, for the same package only --------------
class Holder(pulumi.ComponentResource):
    def __init__(self, name, opts=None):
        super().__init__("test:index:Holder", name, None, opts)


def test_a_child_resource_and_an_invoke_inherit_the_parents_provider_for_their_package():
    """sdk/python/lib/pulumi/resource.py Resource.__init__: ``self._providers = opts.parent._providers``;
    ``_get_providers``: "3. a matching provider inherited from opts.parent" (``opts.parent.get_provider(t)``,
    by package). runtime/invoke.py: ``# If a parent was provided, but no provider was provided, use the
    parent's provider if one was specified.`` ``opts.provider = opts.parent.get_provider(tok)``."""
    seen = {}

    def program():
        provider = aws_provider()
        outer = Holder("outer", pulumi.ResourceOptions(providers={"aws": provider}))
        inner = Holder("inner", pulumi.ResourceOptions(parent=outer))  # grandchildren inherit too
        aws.s3.Bucket("data", opts=pulumi.ResourceOptions(parent=inner))
        pulumi.export("region", aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=inner)).region)
        seen["provider"] = provider

    recording = record(program)
    bucket = recording.one("aws:s3/bucket:Bucket")
    assert recording.by_urn(bucket.provider).name == "workload"
    assert recording.stack_outputs["region"] == "us-west-2"  # answered by the inherited provider


def test_a_parents_provider_for_another_package_is_not_inherited():
    """sdk/python/lib/pulumi/resource.py get_provider: ``pkg = _pkg_from_type(module_member)`` ...
    ``return self._providers.get(pkg)``: a kubernetes provider on the parent gives an AWS child nothing."""
    def program():
        holder = Holder("k8s-only", pulumi.ResourceOptions(providers={"kubernetes": k8s.Provider("cluster", kubeconfig="{}")}))
        aws.s3.Bucket("data", opts=pulumi.ResourceOptions(parent=holder))
        k8s.core.v1.Namespace("team", opts=pulumi.ResourceOptions(parent=holder))
        aws.get_caller_identity_output(opts=pulumi.InvokeOutputOptions(parent=holder))

    message = refusal(program)
    assert "resource aws:s3/bucket:Bucket 'data'" in message
    assert "invoke aws:index/getCallerIdentity:getCallerIdentity" in message
    assert "Namespace 'team'" not in message and "(2 problems)" in message


# -- rule 3: the program and its providers run in the folder `main` names ---------------------
def test_the_working_directory_is_the_folder_main_names(tmp_path):
    """pkg/engine/project.go getPwdMain: ``if maininfo.IsDir() { pwd = main; main = "." } else {
    pwd = filepath.Dir(main)``; sdk/python/cmd/pulumi-language-python-exec: ``os.chdir(args.pwd)``;
    sdk/go/common/resource/plugin/plugin.go (providers): ``cmd.Dir = pwd``."""
    (tmp_path / "app").mkdir()
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: python\nmain: app/\n"
                                          "config:\n  pulumi:disable-default-providers:\n    value: [aws]\n")
    project = read_project(tmp_path)
    assert project.working_dir == tmp_path / "app" and project.config == DENY | {
        "pulumi:disable-default-providers": '["aws"]'}
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: python\nmain: app/__main__.py\n")
    (tmp_path / "app" / "__main__.py").write_text("")
    assert read_project(tmp_path).working_dir == tmp_path / "app"
    (tmp_path / "Pulumi.yaml").write_text("name: p\nruntime: python\nmain: gone/\n")
    with pytest.raises(FileNotFoundError, match="project 'main' could not be read"):
        read_project(tmp_path)


def test_a_relative_path_the_program_reads_breaks_under_main_as_it_does_for_real(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "settings.txt").write_text("x")

    def program():
        pulumi.export("settings", Path("settings.txt").read_text())  # relative to the project root: wrong

    with pytest.raises(FileNotFoundError):
        record(program, working_dir=tmp_path / "app")
    assert record(program, working_dir=tmp_path).stack_outputs["settings"] == "x"


def test_a_relative_path_a_provider_reads_is_resolved_in_main(tmp_path):
    """B2. pulumi-kubernetes provider/pkg/provider/kustomize/v2/directory.go (0fb51f6722d9):
    ``rm, err := k.Run(fSys, directoryArgs.Directory)`` in the provider process, started with
    ``newPlugin(ctx, ctx.Pwd, ...)`` (provider_plugin.go). Assets: source_eval.go
    ``WorkingDirectory: rm.workingDirectory`` (``src.runinfo.Pwd``)."""
    (tmp_path / "app").mkdir()
    (tmp_path / "build" / "overlay").mkdir(parents=True)
    (tmp_path / "build" / "chart.tgz").write_text("")

    def program(directory: str, asset: str):
        def run():
            provider = k8s.Provider("cluster", kubeconfig="{}")
            k8s.kustomize.v2.Directory("operator", directory=directory, opts=pulumi.ResourceOptions(provider=provider))
            aws.s3.BucketObjectv2("chart", bucket="b", source=pulumi.FileAsset(asset),
                                  opts=pulumi.ResourceOptions(provider=aws_provider()))
        return run

    message = refusal(program("build/overlay", "build/chart.tgz"), working_dir=tmp_path / "app", main="app/")
    assert (f"kubernetes:kustomize/v2:Directory 'operator' input `directory` = 'build/overlay': read by the provider "
            f"in its working directory {tmp_path / 'app'} (Pulumi.yaml main: app/)") in message
    assert "aws:s3/bucketObjectv2:BucketObjectv2 'chart' input `source` = 'build/chart.tgz'" in message
    record(program("../build/overlay", "../build/chart.tgz"), working_dir=tmp_path / "app")
    # A path the entry point writes before the program (infra.vendor) need not exist offline.
    record(program("../build/later", "../build/chart.tgz"), working_dir=tmp_path / "app",
           prepared_paths=[tmp_path / "build" / "later"])


def test_the_training_operator_overlay_is_found_from_main():
    """B2 on the real component: run from the folder Pulumi.yaml names, the path the Directory
    gets is where infra.vendor writes the overlay."""
    from components.training import training_operator_overlay_path
    from catalog.versions import TRAINING_OPERATOR_OVERLAY_DIR
    from infra import vendor

    project = read_project(ROOT)
    previous = os.getcwd()
    try:
        os.chdir(project.working_dir)
        path = training_operator_overlay_path()
        assert (project.working_dir / path).resolve() == (vendor.ROOT / TRAINING_OPERATOR_OVERLAY_DIR).resolve()
        assert not os.path.isabs(path)  # the same input on every checkout: no diff between machines
    finally:
        os.chdir(previous)


# -- rule 4: URNs, duplicates and aliases as the engine resolves them ---------------------------
def test_two_resources_with_one_urn_are_refused():
    """step_generator.go generateURN: ``if sg.urns[urn] { ... sg.bailDiag(diag.GetDuplicateResourceURNError(urn), urn)``;
    errors.go: ``Duplicate resource URN '%v'; try giving it a unique name``."""
    def program():
        Holder("same")
        Holder("same")

    assert "Duplicate resource URN 'urn:pulumi:s::p::test:index:Holder::same'" in refusal(program)


def _tree(parent_type: str, parent_name: str, parent_aliases=(), child_aliases=()):
    def program():
        parent = pulumi.ComponentResource(parent_type, parent_name, None,
                                          pulumi.ResourceOptions(aliases=list(parent_aliases)))
        pulumi.ComponentResource("test:index:Child", f"{parent_name}-data", None,
                                 pulumi.ResourceOptions(parent=parent, aliases=list(child_aliases)))
    return program


def test_a_parents_alias_carries_its_children_as_the_engine_multiplies_it_out():
    """step_generator.go generateAliases: ``// Now multiply out any aliases our parent had.``
    ``addAlias(sg.inheritedChildAlias(typ, name, parent.Name(), parentAlias))``; inheritedChildAlias:
    ``if after, ok := strings.CutPrefix(childName, parentName); ok { aliasName = parentAlias.Name() + after``."""
    before = stack_urns(record(_tree("test:index:Store", "store")))
    # Type and name of the parent both change; only the parent says so.
    moved = record(_tree("test:index:Archive", "archive",
                         parent_aliases=[pulumi.Alias(name="store", type_="test:index:Store")]))
    change = diff(before, moved)
    assert change.lost == [] and change.conflicts == []
    assert change.renamed == {
        "urn:pulumi:s::p::test:index:Store::store": "urn:pulumi:s::p::test:index:Archive::archive",
        "urn:pulumi:s::p::test:index:Store$test:index:Child::store-data":
            "urn:pulumi:s::p::test:index:Archive$test:index:Child::archive-data"}
    # Without the parent's alias both are lost: `pulumi up` would delete and recreate them.
    assert len(diff(before, record(_tree("test:index:Archive", "archive"))).lost) == 2


def test_two_resources_claiming_one_old_urn_are_refused():
    """step_generator.go getOldResource: ``if previousAliasURN, alreadyAliased := sg.aliased[urnOrAlias]``
    -> ``diag.GetDuplicateResourceAliasError``: ``Duplicate resource alias '%v' applied to resource with
    URN '%v' conflicting with resource with URN '%v'``."""
    before = stack_urns(record(lambda: Holder("old")))

    def program():
        Holder("new-a", pulumi.ResourceOptions(aliases=[pulumi.Alias(name="old")]))
        Holder("new-b", pulumi.ResourceOptions(aliases=[pulumi.Alias(name="old")]))

    change = diff(before, record(program))
    (conflict,) = change.conflicts  # which of the two registers first is up to the SDK's threads
    assert conflict.startswith("Duplicate resource alias 'urn:pulumi:s::p::test:index:Holder::old' applied to resource")
    assert "Holder::new-a'" in conflict and "Holder::new-b'" in conflict
    assert not change.clean


# -- rule 5: a second `up` of the same program: ignore_changes and write-only inputs -----------
def _secrets(ignore=(), write_only_version=None):
    def program():
        provider = aws_provider()
        password = aws.secretsmanager.get_random_password_output(
            password_length=32, opts=pulumi.InvokeOutputOptions(provider=provider)).random_password
        secret = aws.secretsmanager.Secret("s", opts=pulumi.ResourceOptions(provider=provider))
        if write_only_version is None:
            aws.secretsmanager.SecretVersion("v", secret_id=secret.id, secret_string=password,
                                             opts=pulumi.ResourceOptions(provider=provider, ignore_changes=list(ignore)))
        else:
            aws.secretsmanager.SecretVersion("v", secret_id=secret.id, secret_string_wo=password,
                                             secret_string_wo_version=write_only_version,
                                             opts=pulumi.ResourceOptions(provider=provider))
    return program


def test_a_second_up_rewrites_a_random_value_unless_ignore_changes_or_write_only_holds_it():
    """step_generator.go: ``processedInputs := processIgnoreChanges(sg.deployment.Diag(), urn, inputs,
    old.Inputs, goal.IgnoreChanges)``; processIgnoreChanges: "sets the value for each ignoreChanges property
    in inputs to the value from oldInputs". Write-only (pulumi.com/docs/iac/concepts/secrets/write-only-fields):
    "On subsequent previews or updates, Pulumi will not detect or show diffs on these fields"."""
    def up_twice(program):
        return compare(record(program, epoch=1), record(program, epoch=2))

    assert up_twice(_secrets()).changes == ["aws:secretsmanager/secretVersion:SecretVersion v: secretString"]
    assert up_twice(_secrets(ignore=["secretString"])).changes == []
    held = up_twice(_secrets(write_only_version=1))
    assert held.changes == [] and held.write_only_held == [
        "aws:secretsmanager/secretVersion:SecretVersion v: secretStringWo (write-only; secretStringWoVersion unchanged, "
        "so not sent)"]
    bumped = compare(record(_secrets(write_only_version=1), epoch=1), record(_secrets(write_only_version=2), epoch=2))
    assert bumped.changes == ["aws:secretsmanager/secretVersion:SecretVersion v: secretStringWoVersion"]


def _key_secret(ignore):
    def program():
        key = aws.secretsmanager.get_random_password_output(
            password_length=64, opts=pulumi.InvokeOutputOptions(provider=aws_provider())).random_password
        k8s.core.v1.Secret("key", metadata={"name": "key", "namespace": "team-a"}, string_data={"key": key},
                           opts=pulumi.ResourceOptions(provider=k8s.Provider("k8s", kubeconfig="{}"),
                                                       ignore_changes=list(ignore)))
    return program


def test_a_secrets_random_string_data_is_held_only_by_ignoring_data_too():
    """pulumi-kubernetes's Check moves a Secret's ``stringData`` into ``data`` (pkg/clients/
    unstructured.go ``normalizeSecretStringData``: "StringData overwrites Data", then
    ``RemoveNestedField(uns.Object, "stringData")``), so the state holds ``data``. Ignoring
    ``stringData`` alone resets it to the old value, absent, and the Secret loses its key (seen
    under the real engine); ignoring ``data`` alone lets the new random value overwrite it."""
    def up_twice(ignore):
        return compare(record(_key_secret(ignore), epoch=1), record(_key_secret(ignore), epoch=2))

    assert up_twice([]).changes == ["kubernetes:core/v1:Secret key: data"]
    assert up_twice(["stringData"]).changes == ["kubernetes:core/v1:Secret key: data"]
    assert up_twice(["data"]).changes == ["kubernetes:core/v1:Secret key: data"]
    both = up_twice(["stringData", "data"])
    assert both.changes == [] and both.ignores_nothing == []


def test_an_ignore_changes_path_in_python_names_ignores_nothing():
    """The Python SDK translates only whole top-level names (runtime/resource.py _translate_ignore_changes:
    ``map(lambda k: input_names.get(k) or k, ignore_changes)``), so "scaling_config.desired_size" reaches
    the engine as is; properties_path.go reset: ``if !hasOld && !hasNew { // Neither value contain this
    path, so we're done. return true``: nothing is ignored, silently."""
    def program(path):
        def run():
            aws.eks.NodeGroup("nodes", cluster_name="c", node_role_arn="arn", subnet_ids=["s"],
                              scaling_config={"min_size": 1, "max_size": 3, "desired_size": 1},
                              opts=pulumi.ResourceOptions(provider=aws_provider(), ignore_changes=[path]))
        return run

    wrong = compare(record(program("scaling_config.desired_size"), epoch=1),
                    record(program("scaling_config.desired_size"), epoch=2))
    assert wrong.ignores_nothing == [
        "aws:eks/nodeGroup:NodeGroup nodes: ignore_changes 'scaling_config.desired_size' names no input (inputs: "
        "clusterName, nodeRoleArn, scalingConfig, subnetIds); the engine ignores nothing"]
    right = compare(record(program("scalingConfig.desiredSize"), epoch=1),
                    record(program("scalingConfig.desiredSize"), epoch=2))
    assert right.ignores_nothing == []


def test_ignore_changes_resets_paths_as_the_engine_does():
    """properties_path.go Reset: "resets the values located by the PropertyPath inside the given new
    PropertyMap to the values from the same location in the old PropertyMap"; a leaf missing from old is
    deleted from new."""
    old = {"a": {"b": 1, "c": [1, 2]}, "d": "x"}
    new = {"a": {"b": 2, "c": [3, 4]}, "d": "y", "e": 1}
    assert apply_ignore_changes(new, old, ["a.b", "a.c[1]", "e"]) == {"a": {"b": 1, "c": [3, 2]}, "d": "y"}
    assert apply_ignore_changes(new, old, ["a.*"]) == {"a": {"b": 1, "c": [1, 2]}, "d": "y", "e": 1}
    assert parse_path('tags["kubernetes.io/role"]') == ["tags", "kubernetes.io/role"]


# -- both stacks ------------------------------------------------------------------------------
def test_both_stacks_pass_every_engine_rule(plan):
    """The offline plan ran with Pulumi.yaml's `pulumi:disable-default-providers` and `main`: it raised
    EngineRefusal on any breach (B1: foundation's provider-less getPartition; B2: the overlay path).
    Every AWS and Kubernetes custom resource names its provider."""
    unprovided = [r.urn for r in plan.recording.resources
                  if (r.custom or r.remote) and r.package in ("aws", "kubernetes") and not r.is_provider
                  and not r.provider and r.type != "aws:eks/cluster:Cluster"]
    assert unprovided == []
    assert diff(stack_urns(plan.recording), plan.recording).clean


@pytest.mark.parametrize("stack", ["dev", "prod"])
def test_a_second_up_of_each_stack_changes_nothing(stack):
    """Run twice (the generated passwords differ between the runs, as between two real `up`s): every
    one is held by ignore_changes or a write-only input, and every ignore_changes path names an input
    (components/cluster.py named the node group's desired size in Python spelling: ignored nothing)."""
    result = second_up_of(stack, ROOT)
    assert result.changes == [] and result.ignores_nothing == [], "\n".join(render_second_up(result))
    assert any("mlflow-db-app-value: secretStringWo" in line for line in result.write_only_held)
