"""The `ddpjob` command: validate, render and run DDPJobs (one module per subcommand)."""
from ddpjob.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
