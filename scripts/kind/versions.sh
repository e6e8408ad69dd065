# Sourced by scripts/kind/*.sh: the versions of everything the kind cluster is made of, and the
# cache folders keyed by them (a version change means a rebuild; nothing else does).
DDPJOB_CACHE="${DDPJOB_CACHE:-$HOME/.cache/ddpjob}"
K8S_VERSION="${DDPJOB_K8S_VERSION:-v1.36.3}"
ETCD_VERSION="${DDPJOB_ETCD_VERSION:-v3.6.16}"
KIND_VERSION="${DDPJOB_KIND_VERSION:-v0.33.0}"
COREDNS_VERSION="${DDPJOB_COREDNS_VERSION:-v1.14.2}"
CRICTL_VERSION="${DDPJOB_CRICTL_VERSION:-v1.36.0}"
DEBIAN_SUITE="${DDPJOB_DEBIAN_SUITE:-bookworm}"
KIND_BIN_DIR="$DDPJOB_CACHE/kind/bin-k8s-$K8S_VERSION-kind-$KIND_VERSION-coredns-$COREDNS_VERSION-crictl-$CRICTL_VERSION"
CONTROL_PLANE_DIR="$DDPJOB_CACHE/control-plane/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
