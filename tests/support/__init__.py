"""Test support: what the checks share (schema validation of generated manifests)."""
