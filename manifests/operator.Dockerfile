# The operator image: kopf and the Kubernetes client, never torch. `make images` builds it
# (scripts/images.sh); by hand, from the repository root:
#   docker build -f manifests/operator.Dockerfile -t localhost/ddpjob/operator:0.1.0 .
# Offline, scripts/images.sh adds a folder wheels/ (downloaded on the host with pip) to the
# build context and sets BASE to the project's own Debian image: nothing is fetched.
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
LABEL dev.ddpjob.build-stage=1
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
RUN python3 -m venv /opt/venv
COPY ci/constraints.txt pyproject.toml README.md /tmp/src/
COPY ci/constraints.txt wheel[s] /tmp/wheels/
COPY operator /tmp/src/operator
COPY trainer /tmp/src/trainer
# Pinned versions (ci/constraints.txt); the [operator] extra brings kopf and kubernetes only.
RUN if ls /tmp/wheels/*.whl >/dev/null 2>&1; then export PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/wheels; fi \
 && pip install -c /tmp/src/constraints.txt "/tmp/src[operator]" \
 && python3 -c "import kopf, kubernetes, ddpjob.controller.handlers"

FROM ${BASE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
COPY --from=build /opt/venv /opt/venv
# The bytecode pip wrote is kept (an operator restart, a failover, would compile kubernetes'
# client from source otherwise): checked as trainer/Dockerfile does.
RUN python3 -v -c "import kopf, kubernetes, ddpjob.controller.handlers" 2>/tmp/imports \
 && if grep "^# code object from [^']*[.]py$" /tmp/imports | head -5 | grep .; then \
        echo "no bytecode in the image for the modules above (and more)" >&2; exit 1; \
    fi \
 && rm /tmp/imports
# Non-root, numeric, so runAsNonRoot can be verified by the kubelet.
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ddpjob
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["ddpjob-operator"]
