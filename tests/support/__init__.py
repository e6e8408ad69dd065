"""Helpers shared by the test tiers (and the benchmarks): one copy of each.

- ``manifests``: the good and bad DDPJob manifests every validator is fed (unit and cluster).
- ``jobs``: parsed jobs and pod views for the pure controller and local-runner tests.
- ``datasets``: tiny MNIST and CIFAR-10 files in their real on-disk formats.
- ``operator_fakes``: a fake API (``FakeKube``), DDPJob bodies and pod progress for reconcile
  passes and the workers.
- ``local_run``: ``ddpjob run`` in a child process (multiprocess tier).
- ``progress_jobs``: a tiny DDP program that reports progress and can hang.

A test module never imports another test module (tests/unit/test_boundaries.py): what two
share lives here, in tests/testbed/, or in a tier's ``*_support.py``.
"""
