"""The project's documentation stands alone and its commands are real.

- README.md, CHANGELOG.md, docs/ and examples/ never send a reader outside the repository
  (no `../` path, no absolute path of a machine), and every relative link resolves to a file
  or directory of the repository.
- Every `python -m <module> ...` command in the README and in docs/ (runbooks, architecture) names a
  module of this repository, a subcommand it has, and flags that subcommand accepts (checked
  against the command's own `--help`); every `make <target>` exists in the Makefile.
"""
from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *[p for p in [ROOT / "CHANGELOG.md"] if p.exists()]])
READER_FILES = DOCS + sorted(p for p in (ROOT / "examples").rglob("*") if p.is_file() and p.suffix in (".md", ".yaml", ".py"))
COMMAND_DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

OUTSIDE = [
    (re.compile(r"(?<![\w/.-])/work/"), "a path on the machine that wrote it"),
    (re.compile(r"shared/(ARCHITECTURE|PITFALLS|schemas)"), "a file that is not in the repository"),
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


CLIMB = re.compile(r"(?<![\w.])((?:\.\./)+[\w.\-/]*)")


def outside_references(path: Path, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, why in OUTSIDE:
            if pattern.search(line):
                found.append(f"{_rel(path)}:{number}: {why}: {line.strip()[:120]}")
        for climb in CLIMB.findall(line):
            # `../` is fine while it stays in the repository (docs/runbooks -> docs/architecture.md).
            resolved = (path.parent / climb).resolve()
            if ROOT not in (resolved, *resolved.parents):
                found.append(f"{_rel(path)}:{number}: {climb} leaves the repository: {line.strip()[:120]}")
    return found


@pytest.mark.parametrize("path", READER_FILES, ids=_rel)
def test_no_reader_is_sent_outside_the_repository(path):
    found = outside_references(path, path.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", DOCS, ids=_rel)
def test_relative_links_resolve_inside_the_repository(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        resolved = (path.parent / target.split("#", 1)[0]).resolve()
        if not resolved.exists() or ROOT not in (resolved, *resolved.parents):
            broken.append(target)
    assert not broken, f"{_rel(path)}: links to nothing in the repository: {broken}"


def _tracked_sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.yaml", "*.yml", "*.toml", "Makefile", "*Dockerfile"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    own = {Path(__file__).resolve()}
    return [ROOT / p for p in out if not p.startswith("workloads/rendered/") and (ROOT / p).resolve() not in own]


def test_code_and_comments_name_no_file_outside_the_repository():
    """Comments and docstrings too: a reader of the code cannot follow `see PITFALLS` to a file
    the repository does not have. (.ci/run may point ML_PLATFORM_SCHEMAS at CI's copy.)"""
    found = []
    for path in _tracked_sources():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\.\./shared|shared/(ARCHITECTURE|PITFALLS)|\bPITFALLS\b|/work/", line):
                found.append(f"{_rel(path)}:{number}: {line.strip()[:120]}")
    assert not found, "\n".join(found)


def test_the_outside_check_catches_what_it_names():
    readme, runbook = ROOT / "README.md", ROOT / "docs" / "runbooks" / "x.md"
    assert outside_references(readme, "Read `../shared/ARCHITECTURE.md` for the data flow")
    assert outside_references(readme, "schemas in /work/shared/schemas")
    assert outside_references(runbook, "see [it](../../../elsewhere.md)")
    assert not outside_references(runbook, "see [it](../architecture.md) and ./examples/jobs")


# -- commands ---------------------------------------------------------------------------------
def _code_lines(text: str) -> list[str]:
    """Lines of shell code blocks and of inline code spans, continuation lines joined
    (untagged blocks are diagrams)."""
    lines = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", text, re.S):
        lines += block.replace("\\\n", " ").splitlines()
    lines += re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return lines


def _python_commands(text: str) -> list[list[str]]:
    commands = []
    for line in _code_lines(text):
        line = line.split(" #", 1)[0]
        for match in re.finditer(r"python -m ([\w.]+)([^|;&)]*)", line):
            try:
                words = shlex.split(match.group(2).replace("<", "'<").replace(">", ">'"))
            except ValueError:
                words = match.group(2).split()
            if "-m" in words:  # a launcher's inner command (trainer.launch ... -m trainer train)
                words = words[:words.index("-m")]
            commands.append([match.group(1), *words])
    return commands


def _is_ours(module: str) -> bool:
    top = module.split(".")[0]
    return (ROOT / top).is_dir() and (ROOT / top / "__init__.py").exists()


@functools.lru_cache(maxsize=None)
def _help(module: str, sub: str | None) -> tuple[int, str]:
    args = [sys.executable, "-m", module, *([sub] if sub else []), "--help"]
    out = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    return out.returncode, out.stdout + out.stderr


def _subcommands(help_text: str) -> set[str]:
    choices = re.search(r"\{([\w,-]+)\}", help_text)
    return set(choices.group(1).split(",")) if choices else set()


COMMANDS = sorted({tuple(c) for path in COMMAND_DOCS for c in _python_commands(path.read_text()) if _is_ours(c[0])})


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c)[:80])
def test_documented_python_commands_exist_with_their_flags(command):
    module, *words = command
    code, top_help = _help(module, None)
    assert code == 0, f"python -m {module} --help fails:\n{top_help[-800:]}"
    subs = _subcommands(top_help)
    sub = None
    if subs and words and not words[0].startswith(("-", "<", "...")):
        assert words[0] in subs, f"python -m {module} has no subcommand {words[0]!r} (it has {sorted(subs)})"
        sub = words[0]
    help_text = _help(module, sub)[1] if sub else top_help
    flags = {w.split("=", 1)[0] for w in words if w.startswith("--")}
    unknown = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", help_text))
    assert not unknown, f"python -m {module} {sub or ''}: no such flag(s) {unknown}"


def test_documented_make_targets_exist():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w-]+):", makefile, re.M))
    used = {t for path in DOCS for line in _code_lines(path.read_text())
            for t in re.findall(r"(?:^|\s)make ([\w-]+)", line)}
    assert used and used <= targets, f"make targets that do not exist: {sorted(used - targets)}"


def test_the_command_check_would_catch_a_wrong_flag():
    module, *words = _python_commands("```bash\npython -m infra.plan.deploy up --stack dev --no-such-flag\n```")[0]
    assert module == "infra.plan.deploy" and "--no-such-flag" in words
    assert "--no-such-flag" not in _help("infra.plan.deploy", None)[1]
