"""The platform's policy pack: the same rules for `pulumi preview --policy-pack` and the offline plan."""
