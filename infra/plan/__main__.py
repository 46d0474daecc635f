"""`python -m infra.plan --stack NAME [--json PATH]` (see ``infra.plan``)."""
import sys

from infra.plan import main

sys.exit(main())
