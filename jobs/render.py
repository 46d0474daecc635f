"""`python -m workloads render --stack NAME`: the manifests Argo CD applies, written into the repository.

What a stack declares lives in ``workloads/declared/<stack>/``:

    jobs/*.yaml        job specs (training-jobs format) run as standalone PyTorchJobs/TrainJobs
    pipelines/*.yaml   pipeline declarations (workloads.pipeline.parse_declaration); their
                       ``jobSpec`` points at a job spec that becomes the pipeline's train step
                       (keep those outside jobs/, e.g. pipelines/jobs/, or the job also runs alone)

and is rendered into ``<gitops.renderedPath>`` (default ``workloads/rendered/<stack>``), one
object per file, keys sorted, files sorted, so a pull request shows exactly what Argo CD will
apply. Files no longer rendered are deleted (Argo CD then prunes them: dev syncs automatically,
prod on the next manual sync). ``--check`` writes nothing and fails when the tree is stale.
"""
from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

from components.tracking import K8S_SECRET_NAME
from components.validation import InvalidInputError
from infra.config import ConfigError, PlatformConfig, load_platform_config
from infra.plan import ROOT, raw_project_config, read_stack_file, stack_file
from workloads import gitops, gitops_jobs, pipeline
from workloads.fsx import CLAIM_NAME
from workloads.karpenter import POOL_LABEL

DECLARED_ROOT = "workloads/declared"
HEADER = "# Rendered by `python -m workloads render --stack {stack}` from {declared}/. Do not edit.\n"

# A job spec file (repository-relative) -> the rendered PyTorchJob (or TrainJob).
JobRenderer = Callable[[Path], Mapping[str, Any]]


class RenderError(ValueError):
    """Bad declarations or config: one message listing every problem."""


def load_config(stack: str, root: Path = ROOT) -> PlatformConfig:
    path = stack_file(stack, root)
    if not path.exists():
        raise RenderError(f"no stack file {path.name} in {root}")
    values, _ = read_stack_file(path)
    return load_platform_config(raw_project_config(values), source=f"stack '{stack}' ({path.name})")


class PreflightRefused(ValueError):
    """A declared job that ``python -m workloads preflight`` refuses: its report is the message."""


def default_job_renderer(stack: str, root: Path) -> JobRenderer:
    """Preflight, then the training-jobs renderer, with the stack's platform facts from its
    offline plan: what Argo CD applies passes the same check as ``submit``, and a refused job
    is never written into the tree (its report is the error).

    Only the plan, never ``pulumi stack output``: the rendered tree is a function of the
    repository alone, so the committed tree and CI's render agree byte for byte.
    """
    from workloads import jobspec, trainingjob
    from jobs.preflight import check

    facts = _plan_facts(stack)

    def render_one(path: Path) -> Mapping[str, Any]:
        spec = jobspec.load_job_spec(path)
        if "ttl_after_finished" in spec.model_fields_set:
            # workloads/gitops_jobs.py: a deleted finished job would be recreated by Argo CD.
            raise PreflightRefused(f"ttlAfterFinished: {spec.ttl_after_finished!r} is not allowed on a job Argo CD owns "
                                   "(the operator would delete the finished job and Argo CD would create it again, "
                                   "which re-runs it). Fix: remove ttlAfterFinished; delete the declaration to delete the job")
        # The one preflight every caller runs (jobs/preflight.py check). No checkpoint store on
        # purpose: the rendered tree is a function of the repository alone (an initFrom step is
        # checked by the pod, which refuses a missing one as a permanent failure).
        report = check(spec, facts, repo_root=str(ROOT), store=None)  # trainer configs live with the code
        if not report.ok:
            raise PreflightRefused("preflight refused it (python -m workloads preflight "
                                   f"{path.relative_to(root) if path.is_relative_to(root) else path} --stack {stack}):\n"
                                   + "\n".join(f"      {p.render()}" for p in report.problems))
        return trainingjob.render_resolved(report.job)  # what preflight resolved

    return render_one


@functools.lru_cache(maxsize=None)
def _plan_facts(stack: str):
    # Building the offline plan takes seconds; one render (or test session) needs it once per stack.
    from jobs.facts import facts_for_stack

    return facts_for_stack(stack, use_outputs=False)


@dataclass(frozen=True)
class RenderedObject:
    namespace: str
    manifest: Mapping[str, Any]

    @property
    def filename(self) -> str:
        return f"{self.manifest['kind'].lower()}-{self.manifest['metadata']['name']}.yaml"


def cpu_node_selector(config: PlatformConfig) -> dict[str, str]:
    from infra.gpu_capacity import cpu_pool_spec

    cpu = cpu_pool_spec(config)
    if cpu is None:
        raise RenderError("karpenter.cpuPool.enabled is false: pipeline steps need the CPU pool. "
                          "Fix: enable karpenter.cpuPool or declare no pipelines")
    return {POOL_LABEL: cpu.name}


def declared_objects(config: PlatformConfig, stack: str, root: Path,
                     job_renderer: Optional[JobRenderer]) -> list[RenderedObject]:
    declared = root / DECLARED_ROOT / stack
    job_files = sorted((declared / "jobs").glob("*.yaml"))
    pipeline_files = sorted((declared / "pipelines").glob("*.yaml"))
    if not (job_files or pipeline_files):
        return []
    if job_renderer is None:
        job_renderer = default_job_renderer(stack, root)
    problems: list[str] = []
    objects: list[RenderedObject] = []

    def render_job(path: Path, context: str) -> Optional[Mapping[str, Any]]:
        try:
            return job_renderer(path)  # type: ignore[misc]
        except (InvalidInputError, ValueError, FileNotFoundError) as exc:
            problems.append(f"{context}: {exc}")
            return None

    for path in job_files:
        job = render_job(path, str(path.relative_to(root)))
        if job is not None:
            # No TTL, TrainJobs named by their spec's hash (workloads/gitops_jobs.py).
            job = gitops_jobs.git_owned(job)
            objects.append(RenderedObject(job["metadata"]["namespace"], job))
    for path in pipeline_files:
        source = str(path.relative_to(root))
        try:
            declaration = pipeline.parse_declaration(yaml.safe_load(path.read_text()), source=source)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        job_path = root / declaration.job_spec
        job = render_job(job_path, f"{source}: jobSpec {declaration.job_spec}")
        if job is None:
            continue
        if job.get("kind") != "PyTorchJob":
            problems.append(f"{source}: jobSpec {declaration.job_spec} renders a {job.get('kind')}; the pipeline's "
                            "train step waits on a PyTorchJob. Fix: runtime: pytorchjob in the job spec")
            continue
        try:
            spec = pipeline.pipeline_spec(declaration, job, fsx_claim=CLAIM_NAME, tracking_secret=K8S_SECRET_NAME,
                                          cpu_node_selector=cpu_node_selector(config))
        except ValueError as exc:  # a job spec running your own code
            problems.append(str(exc))
            continue
        objects.append(RenderedObject(spec.namespace, pipeline.workflow_template(spec)))
    if problems:
        raise RenderError(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {DECLARED_ROOT}/{stack}:\n"
                          + "\n".join(f"  - {p}" for p in problems))
    return objects


def _check_objects(spec: gitops.GitOpsSpec, objects: list[RenderedObject]) -> None:
    problems = []
    seen: set[tuple[str, str]] = set()
    for obj in objects:
        where = f"{obj.manifest['kind']} {obj.manifest['metadata']['name']}"
        if obj.namespace not in spec.namespaces:
            problems.append(f"{where}: namespace {obj.namespace} is not a team namespace of the stack "
                            f"({', '.join(spec.namespaces) or 'none'}). Fix: the job spec's team must be in scheduling.teams")
        if not gitops.is_managed_kind(obj.manifest):
            problems.append(f"{where}: Argo CD's project does not admit this kind. Fix: add it to workloads.gitops.MANAGED_KINDS")
        key = (obj.namespace, obj.filename)
        if key in seen:
            problems.append(f"{where}: two declarations render the same object in {obj.namespace}. Fix: rename one")
        seen.add(key)
    if problems:
        raise RenderError("\n".join(problems))


def _dump(manifest: Mapping[str, Any], header: str) -> str:
    return header + yaml.safe_dump(dict(manifest), sort_keys=True, default_flow_style=False, width=120)


def render_tree(stack: str, root: Path = ROOT, job_renderer: Optional[JobRenderer] = None) -> tuple[str, dict[str, str]]:
    """(rendered directory, {relative path: file text}) for one stack."""
    config = load_config(stack, root)
    if config.gitops is None:
        raise RenderError(f"stack {stack} has no gitops section: nothing renders. Fix: add {DECLARED_ROOT}/{stack} "
                          "and a gitops section to the stack file")
    from infra.gitops import gitops_spec

    spec = gitops_spec(config, stack)
    objects = declared_objects(config, stack, root, job_renderer)
    _check_objects(spec, objects)
    header = HEADER.format(stack=stack, declared=f"{DECLARED_ROOT}/{stack}")
    files: dict[str, str] = {}
    for namespace in sorted({o.namespace for o in objects}):
        files[f"apps/application-{namespace}.yaml"] = _dump(gitops.child_application(spec, namespace), header)
    for obj in objects:
        files[f"namespaces/{obj.namespace}/{obj.filename}"] = _dump(obj.manifest, header)
    return spec.rendered_path, dict(sorted(files.items()))


APPLIED_SUFFIXES = (".yaml", ".yml", ".json")


def write_tree(stack: str, root: Path = ROOT, job_renderer: Optional[JobRenderer] = None,
               *, check: bool = False) -> list[str]:
    """Write (or with ``check`` only compare) the tree; returns the paths that differ."""
    rendered, files = render_tree(stack, root, job_renderer)
    out = root / rendered
    # Every kind of file Argo CD's directory source would apply, not only what we write: a
    # hand-added *.yml or *.json is stale too (and removed on write).
    existing = ({str(p.relative_to(out)): p for p in out.rglob("*") if p.is_file() and p.suffix in APPLIED_SUFFIXES}
                if out.is_dir() else {})
    changed = sorted(set(existing) - set(files))
    changed += sorted(p for p, text in files.items() if p not in existing or existing[p].read_text() != text)
    if check:
        return changed
    for stale in set(existing) - set(files):
        existing[stale].unlink()
    for relative, text in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    for directory in sorted((p for p in out.rglob("*") if p.is_dir()), reverse=True) if out.is_dir() else []:
        if not any(directory.iterdir()):
            directory.rmdir()
    # Git keeps no empty directory, and the root Application needs its path: keep a marker.
    (out / "apps").mkdir(parents=True, exist_ok=True)
    keep = out / "apps" / ".gitkeep"
    if not keep.exists():
        keep.write_text("")
    return changed


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("render", help="write the stack's GitOps tree (what Argo CD applies)",
                            description=__doc__.splitlines()[0])
    parser.add_argument("--stack", required=True, help="stack name (Pulumi.<stack>.yaml)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the committed tree is stale")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        changed = write_tree(args.stack, ROOT, check=args.check)
    except (RenderError, ConfigError) as exc:
        print(f"render: {exc}", file=sys.stderr)
        return 2
    if args.check:
        if changed:
            print(f"render: {len(changed)} file(s) stale: {', '.join(changed)}. "
                  f"Fix: python -m workloads render --stack {args.stack}", file=sys.stderr)
            return 1
        print(f"render: stack {args.stack} is up to date")
        return 0
    print(f"render: stack {args.stack}: {len(changed)} file(s) changed" + (f" ({', '.join(changed)})" if changed else ""))
    return 0
