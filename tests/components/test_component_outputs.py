"""A component's outputs are one list: every public attribute a constructor (or one of its steps)
sets is registered with ``register_outputs``, as pulumi-eks does (nodejs/eks/cluster/cluster.ts,
``class Cluster``: each public output is declared on the class and passed to registerOutputs)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMPONENTS = [("components/tracking.py", "Tracking"), ("components/datasets.py", "Datasets"),
              ("components/cluster.py", "Cluster")]


def unregistered(source: str, class_name: str) -> list[str]:
    """Public ``self.<name>`` assignments in the class that no ``register_outputs`` key names."""
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == class_name)
    attributes, keys = set(), set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        for target in targets:
            for item in target.elts if isinstance(target, ast.Tuple) else [target]:
                if (isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) and item.value.id == "self"
                        and not item.attr.startswith("_")):
                    attributes.add(item.attr)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_outputs":
            keys |= {key.value for key in node.args[0].keys if isinstance(key, ast.Constant)}
    assert keys, f"{class_name} registers no outputs"
    return sorted(attributes - keys - {"args"})  # the inputs, not an output


@pytest.mark.parametrize("path, class_name", COMPONENTS)
def test_every_public_attribute_is_a_registered_output(path, class_name):
    assert unregistered((ROOT / path).read_text(), class_name) == []


def test_an_attribute_set_without_registering_it_is_found():
    source = (ROOT / "components/datasets.py").read_text().replace(
        "            self.file_system_id = self.file_system.id\n",
        "            self.file_system_id = self.file_system.id\n            self.forgotten = self.key.arn\n")
    assert unregistered(source, "Datasets") == ["forgotten"]
