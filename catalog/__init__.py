"""Facts about AWS and GPUs, as data: each figure with its source. Imports nothing of ours, so
every layer may read it (tests/infra/test_layout.py)."""
