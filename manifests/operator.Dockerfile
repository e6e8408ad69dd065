# The operator image: kopf and the Kubernetes client, never torch.
#   docker build -f manifests/operator.Dockerfile -t ghcr.io/ddpjob/operator:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY ci/constraints.txt pyproject.toml README.md /tmp/src/
COPY operator /tmp/src/operator
COPY trainer /tmp/src/trainer
# Pinned versions (ci/constraints.txt); the [operator] extra brings kopf and kubernetes only.
RUN pip install -c /tmp/src/constraints.txt "/tmp/src[operator]" && rm -rf /tmp/src

# Non-root, numeric, so runAsNonRoot can be verified by the kubelet.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ddpjob
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["ddpjob-operator"]
