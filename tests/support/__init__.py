"""Helpers shared by the test tiers (and the benchmarks): one copy of each.

- ``manifests``: the good and bad DDPJob manifests every validator is fed (unit and cluster).
- ``jobs``: parsed jobs and pod views for the pure controller and local-runner tests.
- ``datasets``: tiny MNIST and CIFAR-10 files in their real on-disk formats.
"""
