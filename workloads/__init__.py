"""Pure functions that build Kubernetes objects (spec in, dict out).

Used by the Pulumi components and by the GitOps renderer alike; golden files pin them.
Nothing here imports Pulumi.
"""
