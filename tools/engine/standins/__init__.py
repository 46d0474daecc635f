"""Stand-in Pulumi provider plugins for the packages no registry here serves (``aws``, ``eks``):
the real engine loads them from PATH (this directory). README.md says how to run them."""
