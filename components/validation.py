"""Input problems, reported all at once: defined in ``workloads.problems`` (the bottom layer,
which Kubernetes spec validation needs too) and re-exported here for components and infra."""
from workloads.problems import (  # noqa: F401
    InvalidInputError,
    Problem,
    accepts_enum_values,
    coerce_enums,
    raise_if_any,
)
