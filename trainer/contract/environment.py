"""The environment variables the job renderer (workloads/) sets and the trainer side reads: each
name once, so a rename cannot leave one side behind (the failure would show only on a GPU node).
Torch-free."""
from __future__ import annotations

# The job's checkpoint root on the shared file system (trainer/config.py maps it to checkpoint.dir).
ENV_CHECKPOINT_DIR = "TRAINER_CHECKPOINT_DIR"
# The job's stable identity, <namespace>.<name>: a recreated pod finds its MLflow run by it.
ENV_RUN_ID = "TRAINER_RUN_ID"
# The file holding the team's checkpoint signing key (trainer/trust.py), mounted from a Secret.
ENV_CHECKPOINT_KEY_FILE = "TRAINER_CHECKPOINT_KEY_FILE"
# The dataset directory your own code reads (trainer/contract: job().dataset_dir).
ENV_DATASET_DIR = "MLP_DATASET_DIR"
# Your own code's archive: where it is, its SHA-256 and where the launcher unpacks it
# (workloads/owncode.py renders them, trainer/code_archive.py reads them).
ENV_CODE_URI = "MLP_CODE_URI"
ENV_CODE_SHA256 = "MLP_CODE_SHA256"
ENV_CODE_DIR = "MLP_CODE_DIR"
# Where the launcher keeps the virtual environments of your code's requirements.txt
# (workloads/owncode.py renders it on the team's shared file system; trainer/requirements_env.py).
ENV_VENV_ROOT = "MLP_VENV_ROOT"
