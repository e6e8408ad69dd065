"""The decision's policies, one module each, called by ``controller.decide`` in this order:

- ``finish``: a finished job's cleanup and TTL, the activeDeadlineSeconds clock, pods stuck
  Terminating;
- ``admission``: ``suspend`` and Kueue's hold (no pods, Suspended or Queued);
- ``creation``: a new gang (never two at once; the Service must be the job's own), a newer
  attempt's pods adopted, a spec changed while an attempt starts;
- ``gang_watch``: the running attempt, rank by rank, into the status: succeeded, running,
  still starting, or failed; a failure goes to
- ``failure``: whose fault, which budget, fail for good or restart, and in which mode:
  ``restart_mode`` (inside the pods that survive, through their entry points),
  ``kubelet_restarts`` (a command of your own, restarted by the kubelet) or recreate;
- ``stalls``: no progress for too long is a failure of the whole gang;
- ``accounting``: goodput and checkpoint advice on every pass's status.

Each is pure: (job, status, what was observed, now) in, a part of the ``Plan`` out.
"""
