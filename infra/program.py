"""The platform program: config in, every component wired to the account it belongs to.

``main`` is what ``pulumi up`` runs (through ``infra/__main__.py``) and what the offline plan
runs under the recording engine: it reads the stack's config once into the typed model, builds
the foundation, and deploys each capability of ``infra.capabilities.CAPABILITIES`` in order,
exporting what each returns.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional

import pulumi

from infra import chart_mirror, vendor
from infra.capabilities import CAPABILITIES, log_group_names
from infra.config import PROJECT, PlatformConfig, load_platform_config
from infra.ci import read_only_requested
from infra.foundation import build_platform
from infra.platform import Platform


def raw_stack_config() -> tuple[dict[str, Any], list[str]]:
    """The project's config values, JSON objects decoded, and the keys stored as secrets.

    Values are read through ``pulumi.Config`` (the engine's decrypted values, with its notion of
    which keys are secret); only the key *names* come from the config store, so that unknown
    keys can be reported. Fields typed ``SecretStr`` reach resources as secret Outputs.
    """
    names = {**pulumi.runtime.get_config_env(), **pulumi.runtime.config.CONFIG.get()}
    config = pulumi.Config(PROJECT)
    raw: dict[str, Any] = {}
    secret_keys: list[str] = []
    prefix = f"{PROJECT}:"
    for full_key in names:
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix):]
        raw[key] = decode(config.get(key))
        if pulumi.runtime.is_config_secret(full_key):
            secret_keys.append(key)
    return raw, secret_keys


def decode(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        decoded = json.loads(value)
    except ValueError:
        return value
    # Only structured values are JSON-encoded by the CLI; "123" stays a string.
    return decoded if isinstance(decoded, (dict, list, bool)) else value


def read_config() -> PlatformConfig:
    stack = pulumi.get_stack()
    raw, secret_keys = raw_stack_config()
    return load_platform_config(raw, source=f"stack '{stack}' (Pulumi.{stack}.yaml)", secret_paths=secret_keys)


def prepare_files(config: PlatformConfig) -> None:
    """What `pulumi up` must have on disk before any resource is registered: the verified
    Training Operator tree and overlay (``infra.vendor``) and, with a chart mirror, every chart
    the stack installs, verified (``infra.chart_mirror``). Raises ``VendorError`` or
    ``ChartMirrorError`` (one line per problem)."""
    vendor.prepare()
    chart_mirror.prepare(config)


def main(prepare: Optional[Callable[[PlatformConfig], Any]] = None) -> Platform:
    """prepare: what the real entry point must have on disk before any resource, given the valid
    config (``prepare_files``); the offline plan runs without it and touches no network."""
    config = read_config()
    # Offline too: a mirror cannot serve a chart whose archive has no pinned SHA-256.
    chart_mirror.check_pins(config)
    if prepare is not None:
        prepare(config)
    platform = build_platform(config, log_group_names(config), read_only=read_only_requested(),
                              charts=chart_mirror.chart_source(config))
    for capability in CAPABILITIES:
        for key, value in capability.deploy(platform).items():
            pulumi.export(key, value)
    platform.seal_access_logs()
    return platform


def run() -> Platform:
    """What `pulumi up` runs: ``infra/__main__.py`` under the language host, or the deploy driver's
    inline program (``python -m infra.plan.deploy --inline``). A config mistake, a vendored tree that
    does not match its pin or a chart mirror that cannot serve a pinned chart becomes a
    ``RunError``: the message alone, not a program crash."""
    from components.validation import InvalidInputError
    from infra.chart_mirror import ChartMirrorError
    from infra.vendor import VendorError

    try:
        # Once the config is valid, and before any resource: the Training Operator overlay is built
        # from a verified local tree (no git at deploy time), and with a chart mirror every chart is
        # downloaded and checked against its pinned SHA-256.
        return main(prepare=prepare_files)
    except (VendorError, ChartMirrorError) as error:
        raise pulumi.RunError(str(error)) from None
    except InvalidInputError as error:
        # RunError prints the message alone: a config mistake is not a program crash.
        raise pulumi.RunError(str(error)) from None
