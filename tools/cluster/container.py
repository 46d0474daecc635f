"""Start one container of a pod: the last step of the kubelet (tools/cluster/kubelet.py).

    python -m tools.cluster.container SPEC.json

Run by the kubelet inside the pod's network namespace and a fresh mount namespace (``nsenter`` +
``unshare --mount``). It builds the container's file system as a container runtime would, then
executes the command in place of itself (``execve``: the kubelet's process is the container's):

- a root of its own (a tmpfs under the pod's directory) holding the host's ``/usr`` and ``/lib*``
  read-only, an ``/etc`` of its own with the host's certificates, users and resolver files,
  ``/dev`` and ``/proc``, and an empty private ``/tmp``;
- each of the pod's volume mounts at its ``mountPath`` (``subPath`` too), from the directories the
  kubelet wrote (ConfigMaps, Secrets, projected service account tokens, emptyDirs);
- the pinned binary at the image's command path.

Nothing is mounted outside this mount namespace, so nothing needs unmounting: the mounts end
with the process. ``"chroot": false`` (the Python stand-ins that need the project and its
virtualenv) keeps the host's root and gives the process a temporary directory of its own.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
from pathlib import Path

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 32, 4096, 16384, 1 << 18
ETC_FROM_HOST = ("ssl", "ca-certificates", "pki", "passwd", "group", "hosts", "resolv.conf", "nsswitch.conf",
                 "localtime", "services", "protocols")
_libc = ctypes.CDLL(None, use_errno=True)


def mount(source: str, target: str, fstype: str = "", flags: int = 0, data: str = "") -> None:
    if _libc.mount(source.encode(), target.encode(), fstype.encode() or None, flags, data.encode() or None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target}: {os.strerror(errno)}")


def bind(source: str, target: str, read_only: bool = False) -> None:
    mount(source, target, flags=MS_BIND | MS_REC)
    if read_only:
        try:
            mount("", target, flags=MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)
        except OSError:
            pass  # a locked mount (user namespace) stays as it is


def make_target(root: Path, path: str, like: Path) -> Path:
    target = root / path.lstrip("/")
    if like.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch(exist_ok=True)
    return target


def build_root(spec: dict) -> Path:
    root = Path(spec["rootfs"])
    root.mkdir(parents=True, exist_ok=True)
    mount("tmpfs", str(root), "tmpfs", 0, "mode=755")
    for name in ("usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32", "opt"):
        host = Path("/") / name
        if host.is_symlink():
            (root / name).symlink_to(os.readlink(host))
        elif name == "etc" and host.is_dir():
            # Pods mount volumes under /etc (the Training Operator's init-container template at
            # /etc/config): the host's /etc as the lower layer of an overlay, so a mount point can
            # be made there without touching the host's /etc (a read-only bind refused the mkdir).
            (root / name).mkdir()
            upper, work = root / ".etc-upper", root / ".etc-work"
            upper.mkdir()
            work.mkdir()
            mount("overlay", str(root / name), "overlay", 0, f"lowerdir={host},upperdir={upper},workdir={work}")
        elif host.is_dir():
            (root / name).mkdir()
            bind(str(host), str(root / name), read_only=True)
    # /etc is the container's own (volumes mount there: /etc/config...): only the files a static
    # binary reads come from the host.
    etc = root / "etc"
    etc.mkdir()
    for name in ETC_FROM_HOST:
        host = Path("/etc") / name
        if host.is_dir():
            (etc / name).mkdir()
            bind(str(host), str(etc / name), read_only=True)
        elif host.is_file():
            (etc / name).touch()
            bind(str(host), str(etc / name), read_only=True)
    for name in ("dev", "proc", "sys"):
        (root / name).mkdir()
        bind(f"/{name}", str(root / name))
    (root / "tmp").mkdir(mode=0o1777)
    (root / "var" / "run").mkdir(parents=True)
    for extra in spec.get("host_paths", []):
        target = make_target(root, extra, Path(extra))
        bind(extra, str(target), read_only=True)
    return root


def mount_volumes(root: Path, spec: dict) -> None:
    for volume in spec.get("mounts", []):
        source = Path(volume["source"])
        target = make_target(root, volume["path"], source)
        bind(str(source), str(target), read_only=volume.get("readOnly", False))
    binary = spec.get("binary")
    if binary:
        target = make_target(root, binary["path"], Path(binary["source"]))
        bind(binary["source"], str(target), read_only=True)


def private_tmp(spec: dict) -> None:
    """A temporary directory of its own (``TMPDIR``): the host's /tmp stays visible, since the
    plane's own directory may be under it."""
    tmp = Path(spec["tmp"])
    tmp.mkdir(parents=True, exist_ok=True)
    spec["env"]["TMPDIR"] = str(tmp)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    mount("", "/", flags=MS_REC | MS_PRIVATE)
    if spec.get("chroot", True):
        root = build_root(spec)
        mount_volumes(root, spec)
        os.chroot(str(root))
        os.chdir(spec.get("workingDir") or "/")
    else:
        private_tmp(spec)
        os.chdir(spec.get("workingDir") or "/")
    os.execve(spec["argv"][0], spec["argv"], spec["env"])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
