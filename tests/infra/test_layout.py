"""Dependencies point one way (jobs -> infra -> components -> workloads -> trainer -> catalog) and no package has an
import cycle (trainer/ included: its torch-free contract modules, trainer/contract/{layout,environment,memory}.py,
are all of it that components/ and workloads/ may read).

Every ``import`` counts: module level, inside functions, and under ``if TYPE_CHECKING`` (a cycle
hidden in a function is still a cycle: it only moves the failure to the first call).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "infra", "components", "workloads", "policypack", "trainer", "catalog")
# A package may import itself and the packages listed here, nothing else of ours.
ALLOWED = {
    "jobs": {"infra", "components", "workloads", "policypack", "trainer", "catalog"},
    "infra": {"components", "workloads", "policypack", "trainer", "catalog"},
    "components": {"workloads", "trainer", "catalog"},
    "workloads": {"trainer", "catalog"},
    "policypack": {"catalog"},
    "trainer": {"catalog"},
    "catalog": set(),
}
# Below infra/, the trainer is reached only through its torch-free contract modules: the names both
# sides of the platform must agree on (checkpoint layout, environment, memory rule), not its code.
# trainer.gpu_faults is the GPU-fault termination message both sides read (the launcher writes it,
# the node agent parses it; standard library only, mounted beside the agent).
TRAINER_CONTRACTS = {"trainer.contract.layout", "trainer.contract.environment", "trainer.contract.memory",
                     "trainer.gpu_faults"}
CONTRACT_ONLY = {"components", "workloads"}
# Entry points (``python -m ...``, any ``__main__``) follow their package's rules like every other
# module, with no exemption; nothing in another package imports them but a shim.
# A shim keeps a documented command working after its module moved up a layer: it may import its
# target and nothing else. Named here rather than reached through runpy/importlib, which would hide
# the arrow from this walk.
SHIMS = {
    # `python -m workloads ...` is in the README, the runbooks and the examples; the CLI itself is
    # jobs/__main__.py (issue 26).
    "workloads.__main__": "jobs.__main__",
}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (``from pkg import mod`` resolves to ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports_of(name, path, set(found)) for name, path in found.items()}


def upward_imports(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, targets in sorted(edges.items()):
        for target in sorted(targets):
            source_package, target_package = name.split(".")[0], target.split(".")[0]
            if SHIMS.get(name) == target or source_package == target_package:
                continue  # (trainer.launch runs trainer.__main__'s commands in-process: one package)
            if target.endswith(".__main__"):
                bad.append(f"{name} imports the entry point {target}")
            elif target_package not in ALLOWED[source_package]:
                bad.append(f"{name} imports {target} ({source_package} may import only {sorted(ALLOWED[source_package]) or 'itself'})")
            elif target_package == "trainer" and source_package in CONTRACT_ONLY and target not in TRAINER_CONTRACTS:
                bad.append(f"{name} imports {target} ({source_package} may import only the trainer's contract modules)")
    return bad


def cycles(edges: dict[str, set[str]], prefix: str) -> list[list[str]]:
    """Import cycles among the modules under ``prefix`` (one path per strongly connected set)."""
    nodes = sorted(n for n in edges if n.split(".")[0] == prefix)
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(edges[node]):
            if target not in nodes:
                continue
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[node] = "done"

    for node in nodes:
        if node not in state:
            visit(node)
    return found


def test_the_walk_sees_the_imports_it_checks():
    edges = graph()
    assert "infra.capabilities" in edges["infra.program"]
    assert "infra.gpu_capacity" in edges["infra.capabilities"]  # `from infra import gpu_capacity`
    assert "workloads.fsx" in edges["components.datasets"]  # a parenthesised `from ... import (...)`
    assert "trainer.model_facts" in edges["jobs.preflight"]
    assert "trainer.config" in edges["trainer.model"]
    assert "trainer.contract.environment" in edges["workloads.owncode"]


def test_no_module_imports_a_layer_above_it():
    assert upward_imports(graph()) == []


def test_each_shim_only_forwards_to_its_target():
    edges = graph()
    for shim, target in SHIMS.items():
        assert edges[shim] == {target}, f"{shim} must import {target} and nothing else of ours"
        body = ast.parse(modules()[shim].read_text()).body
        # docstring, imports, `if __name__ == "__main__": sys.exit(main())`: no logic of its own
        assert all(isinstance(node, (ast.Expr, ast.Import, ast.ImportFrom, ast.If)) for node in body), shim


def test_every_package_is_walked():
    """Every top-level Python package of the repository is under the layout rules (tools/ and
    tests/ are scripts and checks, not layers)."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert packages - {"tests", "tools"} == set(PACKAGES)


def test_no_import_cycle_in_any_package():
    edges = graph()
    for package in PACKAGES:
        assert cycles(edges, package) == [], f"import cycle in {package}/"


def test_the_checks_catch_what_they_name():
    edges = {name: set(targets) for name, targets in graph().items()}
    edges["workloads.gpu_catalog"].add("components.k8s")
    edges["components.bucket"].add("infra.config")
    edges["infra.plan"].add("infra.program")
    edges["infra.program"].add("infra.plan")
    edges["trainer.model_facts"].add("workloads.instances")
    edges["trainer.config"].add("trainer.model")  # the config <-> model cycle of old
    edges["workloads.__main__"].add("jobs.render")  # a shim that does more than forward
    edges["infra.plan"].add("jobs.__main__")  # an entry point is nobody's library
    edges["workloads.owncode"].add("trainer.checkpoint")  # the trainer's code, not its contract
    assert upward_imports(edges) == [
        "components.bucket imports infra.config (components may import only ['catalog', 'trainer', 'workloads'])",
        "infra.plan imports the entry point jobs.__main__",
        "trainer.model_facts imports workloads.instances (trainer may import only ['catalog'])",
        "workloads.__main__ imports jobs.render (workloads may import only ['catalog', 'trainer'])",
        "workloads.gpu_catalog imports components.k8s (workloads may import only ['catalog', 'trainer'])",
        "workloads.owncode imports trainer.checkpoint (workloads may import only the trainer's contract modules)",
    ]
    assert [set(cycle) for cycle in cycles(edges, "infra")] == [{"infra.plan", "infra.program"}]
    assert [set(cycle) for cycle in cycles(edges, "trainer")] == [{"trainer.config", "trainer.model"}]


def import_closure(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every project module ``start`` imports, directly or through others."""
    reached, pending = set(), [start]
    while pending:
        for target in edges[pending.pop()] - reached:
            reached.add(target)
            pending.append(target)
    return reached


def offline_wing(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m == "infra.plan" or m.startswith("infra.plan."))


def test_what_pulumi_up_runs_imports_nothing_of_the_offline_wing():
    """`pulumi up` runs ``infra/__main__.py`` -> ``infra.program``; the recording engine, its
    fabricated outputs and the offline tools (``infra/plan/``) stay out of that closure. The program
    reads the recorded graph through ``infra.recording`` only."""
    edges = graph()
    for root in ("infra.program", "infra.__main__"):
        reached = import_closure(edges, root)
        assert {"infra.capabilities", "infra.costs", "infra.recording"} <= reached  # the walk follows imports
        assert offline_wing(reached) == [], f"{root} reaches the offline wing"


def test_the_closure_check_sees_a_program_module_importing_the_engine():
    edges = {name: set(targets) for name, targets in graph().items()}
    edges["infra.costs"].add("infra.plan.mock_engine")
    assert "infra.plan.mock_engine" in offline_wing(import_closure(edges, "infra.program"))


def test_the_program_and_the_plan_use_the_one_capability_tuple(dev_plan, monkeypatch):
    from infra import capabilities, plan as plan_module, program
    from infra.foundation import FOUNDATION

    assert program.CAPABILITIES is capabilities.CAPABILITIES is plan_module.CAPABILITIES
    assert capabilities.CAPABILITIES[0] is FOUNDATION
    names = [c.name for c in capabilities.CAPABILITIES]
    assert len(set(names)) == len(names)
    titles = [title for title, _ in plan_module.plan_sections(dev_plan.config, dev_plan.recording)]
    assert titles == [title for c in capabilities.CAPABILITIES for title, _ in c.plan_sections(dev_plan.config, dev_plan.recording)] + [
        "Idle cost per month (no job running)"]
    # Nothing is registered behind the tuple's back: without a capability, its sections,
    # warnings and cost lines are gone from the plan.
    removed = [c for c in capabilities.CAPABILITIES if c.name in ("datasets", "tracking")]
    assert len(removed) == 2
    monkeypatch.setattr(plan_module, "CAPABILITIES", tuple(c for c in capabilities.CAPABILITIES if c not in removed))
    titles = [title for title, _ in plan_module.plan_sections(dev_plan.config, dev_plan.recording)]
    assert "Datasets" not in titles and "Tracking" not in titles and "Logs and audit" in titles
    assert not any(line.item.startswith(("Aurora", "Fargate", "FSx")) for line in plan_module.idle_costs(dev_plan.recording))
