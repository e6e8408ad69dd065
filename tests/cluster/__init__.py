"""The test bed: a real control plane, a node agent that plays the kubelet, fixtures."""
