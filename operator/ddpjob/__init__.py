"""DDPJob: the API, the kopf operator and the `ddpjob` command (never imports torch)."""
__version__ = "0.1.0"
