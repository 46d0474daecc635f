"""trainer/Dockerfile, read (no Docker engine here): the pins and environment that matter
for EFA, torch.compile, the compiler caches and the NCCL flight recorder."""
import glob
import os
import re
import shlex

import pytest
import torch

from trainer_helpers import REPO

DOCKERFILE = os.path.join(REPO, "trainer", "Dockerfile")


def instructions(path=DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comment lines dropped, as
    Docker's parser does."""
    logical, current = [], ""
    for raw in open(path):
        line = raw.rstrip("\n")
        if line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        if current.strip():
            keyword, _, rest = current.strip().partition(" ")
            logical.append((keyword.upper(), rest.strip()))
        current = ""
    return logical


def env_of(parsed) -> dict[str, str]:
    env = {}
    for keyword, rest in parsed:
        if keyword == "ENV":
            for item in shlex.split(rest):
                key, _, value = item.partition("=")
                env[key] = value
    return env


@pytest.fixture(scope="module")
def parsed():
    return instructions()


def test_base_image_is_pinned_to_the_torch_the_trainer_is_tested_with(parsed):
    (base,) = [rest for keyword, rest in parsed if keyword == "FROM"]
    match = re.fullmatch(r"pytorch/pytorch:(\d+\.\d+\.\d+)-cuda(\d+\.\d+)-cudnn\d+-(runtime|devel)(@sha256:[0-9a-f]{64})?", base)
    assert match, base
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    assert f'"torch=={match.group(1)}"' in pyproject  # the image's torch is the one the tests ran
    assert match.group(1) == torch.__version__.split("+")[0]


def test_efa_installer_is_pinned_and_installed_the_container_way(parsed):
    args = {rest.partition("=")[0]: rest.partition("=")[2] for keyword, rest in parsed if keyword == "ARG"}
    version = args.get("EFA_INSTALLER_VERSION", "")
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"EFA installer must be pinned, got {version!r}"
    # 1.43+ bundles aws-ofi-nccl 1.16+ (EFA changelog); older installers need the plugin built by hand.
    assert tuple(map(int, version.split("."))) >= (1, 43, 0)
    runs = " ".join(rest for keyword, rest in parsed if keyword == "RUN")
    assert "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" in runs
    installer = re.search(r"\./efa_installer\.sh ([^&]*)", runs).group(1).split()
    for flag in ("-y", "--skip-kmod", "--skip-limit-conf", "--no-verify"):
        assert flag in installer  # docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-installer-containers.html
    # The build fails unless the OFI NCCL plugin and libfabric are there, and both are on the loader path.
    assert "libnccl-net*.so" in runs and "test -s /etc/ld.so.conf.d/aws-ofi-nccl.conf" in runs
    assert "libfabric.so" in runs and "ldconfig" in runs
    assert "latest" not in runs


def test_a_compiler_for_torch_compile_is_installed(parsed):
    runs = " ".join(rest for keyword, rest in parsed if keyword == "RUN")
    installs = re.findall(r"apt-get install ([^&]*)", runs)
    packages = {p for group in installs for p in group.split() if not p.startswith("-")}
    assert {"gcc", "g++"} <= packages, packages


def test_compiler_caches_and_flight_recorder_dumps_live_on_fsx(parsed):
    env = env_of(parsed)
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"):
        assert env[key].startswith("/fsx/"), (key, env.get(key))
    assert env["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    assert int(env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0 and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_ENABLE_MONITORING"] == "1"  # a dump on timeout needs the monitoring thread
    assert int(env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"]) >= 60


def test_every_torch_variable_of_the_image_is_one_torch_reads(parsed):
    """A misspelt variable is silently ignored: check each TORCH* name against the strings
    of the installed torch 2.13 (its C++ library and Python sources)."""
    names = [k for k in env_of(parsed) if k.startswith("TORCH")]
    assert names
    torch_dir = os.path.dirname(torch.__file__)
    blobs = [open(p, "rb").read() for p in glob.glob(os.path.join(torch_dir, "lib", "libtorch_cpu.so*"))]
    sources = [os.path.join(torch_dir, "_inductor", "config.py"), os.path.join(torch_dir, "_inductor", "runtime", "cache_dir_utils.py"),
               os.path.join(torch_dir, "distributed", "elastic", "multiprocessing", "api.py"),
               os.path.join(torch_dir, "distributed", "run.py")]
    blobs += [open(p, "rb").read() for p in sources if os.path.exists(p)]
    blobs += [open(p, "rb").read() for p in glob.glob(os.path.join(torch_dir, "include", "torch", "csrc", "distributed", "c10d", "*.hpp"))]
    unknown = [n for n in names if not any(n.encode() in blob for blob in blobs)]
    assert not unknown, f"torch 2.13 never reads {unknown}"


def test_runs_as_uid_1000_with_tini_and_the_launcher(parsed):
    assert ("USER", "1000") in parsed
    (entrypoint,) = [rest for keyword, rest in parsed if keyword == "ENTRYPOINT"]
    assert entrypoint == '["/usr/bin/tini", "--", "python", "-m", "trainer.launch"]'


def test_requirements_match_the_trainer_extra():
    pyproject = open(os.path.join(REPO, "pyproject.toml")).read()
    for line in open(os.path.join(REPO, "trainer", "requirements.txt")):
        line = line.strip()
        if line and not line.startswith("#"):
            assert f'"{line}"' in pyproject, f"{line} differs from pyproject's trainer extra"


def test_runtime_dirs_are_created_for_the_image_environment(tmp_path):
    from trainer.preflight import prepare_runtime_dirs

    made = prepare_runtime_dirs({"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind"),
                                 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(tmp_path / "debug" / "nccl_trace_rank_")})
    assert os.path.isdir(tmp_path / "ind") and os.path.isdir(tmp_path / "debug")
    assert len(made) == 2


def test_the_image_copies_every_package_the_trainer_imports(parsed):
    """The trainer reads its GPU peaks from catalog/ (tests/infra/test_layout.py: trainer may import
    catalog): an image without it fails at `import trainer.metrics`, on the GPU node."""
    import ast

    ours = {"catalog", "components", "infra", "jobs", "policypack", "trainer", "workloads"}
    imported = set()
    for path in glob.glob(os.path.join(REPO, "trainer", "**", "*.py"), recursive=True):
        for node in ast.walk(ast.parse(open(path).read())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            imported |= {n.split(".")[0] for n in names} & ours
    copied = {rest.split()[-2].strip("/").split("/")[0] for keyword, rest in parsed if keyword == "COPY"
              and rest.split()[-1].startswith("/app/")}
    assert imported == {"trainer", "catalog"} and imported <= copied, (imported, copied)
