"""The `ddpjob` command: submit, run, validate and render DDPJobs."""
from ddpjob.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
