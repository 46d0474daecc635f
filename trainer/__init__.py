"""Containerized PyTorch trainer: DDP/FSDP2, atomic resumable checkpoints, spot-safe exits, MLflow."""
