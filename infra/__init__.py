"""The platform's Pulumi program: typed config, accounts, wiring, offline plan."""
