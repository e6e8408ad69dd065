"""The user's side of a cluster: `ddpjob submit` (the Kubernetes client in cluster.py alone)."""
