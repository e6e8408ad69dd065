"""``python -m ddpjob.cli``: the `ddpjob` command."""
import sys

from ddpjob.cli.main import main

sys.exit(main())
