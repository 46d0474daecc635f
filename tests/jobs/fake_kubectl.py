"""A fake ``kubectl`` executable backed by ``FakeKubeApi`` state in a JSON file ($FAKE_KUBE_STATE).

It accepts exactly the command lines ``jobs.kube.KubectlApi`` builds (so their argv is tested
from outside the process) and refuses anything else the way kubectl does (exit 1, "error: unknown
flag"). ``$FAKE_KUBE_UNREACHABLE`` makes it fail as kubectl does without a reachable API server.
``install(directory)`` writes the executable; put the directory first on PATH.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def install(directory: Path) -> Path:
    path = Path(directory) / "kubectl"
    path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                    "from tests.jobs.fake_kubectl import main\nsys.exit(main(sys.argv[1:]))\n")
    path.chmod(0o755)
    return path


class Usage(Exception):
    pass


def _take(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag:
            if i + 1 >= len(args):
                raise Usage(f"error: flag needs an argument: {flag}")
            value = args[i + 1]
            del args[i:i + 2]
            return value
        if arg.startswith(flag + "=") and flag.startswith("--"):
            del args[i]
            return arg.split("=", 1)[1]
    return None


def _flag(args: list[str], flag: str) -> bool:
    if flag in args:
        args.remove(flag)
        return True
    return False


def _identity() -> tuple[str, list[str]]:
    """$FAKE_KUBE_USER and $FAKE_KUBE_GROUPS (comma-separated); default a cluster admin."""
    groups = os.environ.get("FAKE_KUBE_GROUPS")
    return (os.environ.get("FAKE_KUBE_USER", "kubernetes-admin"),
            groups.split(",") if groups else ["system:masters", "system:authenticated"])


class Forbidden(Exception):
    pass


def _authorize(verb: str, args: list[str]) -> None:
    """A team member (a group mlplatform:team-<name>) may act in team-<name> only, as the team's
    Role binds them; nodes and every namespace are out of reach (kubectl's 403 wording)."""
    user, groups = _identity()
    teams = [g.removeprefix("mlplatform:") for g in groups if g.startswith("mlplatform:team-")]
    if not teams or verb == "auth":
        return
    namespace = _take(list(args), "-n")
    resource = next((a for a in args if not a.startswith("-")), "")
    if "--all-namespaces" in args or resource == "nodes" or (namespace is not None and namespace not in teams):
        scope = "at the cluster scope" if namespace is None else f'in the namespace "{namespace}"'
        raise Forbidden(f'Error from server (Forbidden): {resource} is forbidden: User "{user}" cannot {verb} '
                        f'resource "{resource}" in API group "" {scope}')


def main(argv: list[str]) -> int:
    from tests.jobs.fake_kube import FakeKubeApi

    if os.environ.get("FAKE_KUBE_UNREACHABLE"):
        for _ in range(3):  # kubectl retries discovery and prints each failure
            print("E1125 10:00:00.000000  memcache.go:265] couldn't get current server API group list: Get "
                  "\"http://localhost:8080/api?timeout=32s\": dial tcp 127.0.0.1:8080: connect: connection refused",
                  file=sys.stderr)
        print("The connection to the server localhost:8080 was refused - did you specify the right host or port?",
              file=sys.stderr)
        return 1
    state = Path(os.environ["FAKE_KUBE_STATE"])
    # One kubectl at a time on the state (the client runs one per rank in parallel for --all),
    # as the API server serialises writes.
    with open(state.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _serve(argv, state, FakeKubeApi.load(state))


def _serve(argv: list[str], state: Path, api) -> int:
    from jobs.kube import AlreadyExists, KubeError

    args = list(argv)
    try:
        # kubectl's global flags, as KubectlApi(kubeconfig=..., context=...) puts them first.
        kubeconfig, context = _take(args, "--kubeconfig"), _take(args, "--context")
        if kubeconfig is not None and not Path(kubeconfig).is_file():
            raise Usage(f"error: stat {kubeconfig}: no such file or directory")
        if context is not None:
            known = os.environ.get("FAKE_KUBE_CONTEXTS", "")
            if context not in known.split(","):
                raise Usage(f'error: context "{context}" does not exist')
        verb = args.pop(0)
        _authorize(verb, list(args))
        if verb == "auth":
            if args != ["whoami", "-o", "json"]:
                raise Usage(f"error: unexpected auth arguments {argv}")
            user, groups = _identity()
            print(json.dumps({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview",
                              "status": {"userInfo": {"username": user, "groups": groups}}}))
            return 0
        if verb == "get":
            namespace = _take(args, "-n")
            every = _flag(args, "--all-namespaces")
            selector = _take(args, "-l")
            ignore = _flag(args, "--ignore-not-found")
            if _take(args, "-o") != "json":
                raise Usage("error: the fake kubectl serves -o json only")
            resource, *rest = args
            if len(rest) > 1 or (rest and rest[0].startswith("-")):
                raise Usage(f"error: unknown flag: {rest[-1]}")
            if rest:
                obj = api.get(resource, rest[0], namespace)
                if obj is None:
                    if ignore:
                        return 0
                    print(f'Error from server (NotFound): {resource} "{rest[0]}" not found', file=sys.stderr)
                    return 1
                print(json.dumps(obj))
            else:
                if not (namespace or every):
                    raise Usage("error: the client always names a namespace or --all-namespaces")
                print(json.dumps({"kind": "List", "items": api.list(resource, None if every else namespace, selector)}))
        elif verb == "apply":
            if not (_flag(args, "--server-side") and _take(args, "--field-manager") and _take(args, "-f") == "-"
                    and _take(args, "-o") == "json") or args:
                raise Usage(f"error: unexpected apply arguments {argv}")
            print(json.dumps(api.apply(json.loads(sys.stdin.read()))))
        elif verb == "create":
            if not (_take(args, "--field-manager") and _take(args, "-f") == "-" and _take(args, "-o") == "json") or args:
                raise Usage(f"error: unexpected create arguments {argv}")
            try:
                print(json.dumps(api.create(json.loads(sys.stdin.read()))))
            except AlreadyExists as exc:  # kubectl's words for the API server's 409
                print(f'Error from server (AlreadyExists): error when creating "STDIN": {exc}', file=sys.stderr)
                return 1
        elif verb == "patch":
            namespace, kind, body = _take(args, "-n"), _take(args, "--type"), _take(args, "-p")
            if kind != "merge" or _take(args, "-o") != "json" or len(args) != 2:
                raise Usage(f"error: unexpected patch arguments {argv}")
            print(json.dumps(api.patch(args[0], args[1], namespace, json.loads(body))))
        elif verb == "delete":
            namespace, cascade, wait = _take(args, "-n"), _take(args, "--cascade"), _take(args, "--wait")
            if cascade not in ("foreground", "background", "orphan") or wait != "false" or len(args) != 2:
                raise Usage(f"error: unexpected delete arguments {argv}")
            api.delete(args[0], args[1], namespace, propagation=cascade.capitalize())
            print(f'{args[0]} "{args[1]}" deleted')
        elif verb == "logs":
            namespace, container = _take(args, "-n"), _take(args, "-c")
            follow = _flag(args, "-f")
            if len(args) != 1 or args[0].startswith("-"):
                raise Usage(f"error: unexpected logs arguments {argv}")
            for line in api.logs(args[0], namespace, container, follow=follow):
                print(line, flush=True)
        else:
            raise Usage(f'error: unknown command "{verb}" for "kubectl"')
    except Usage as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except Forbidden as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except KubeError as exc:
        print(f"Error from server: {exc}", file=sys.stderr)
        return 1
    finally:
        api.save(state)
    return 0
