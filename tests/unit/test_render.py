"""`ddpjob render`: exactly the builders' objects, as YAML that kubectl can apply."""
from __future__ import annotations

import argparse
import io
import textwrap

import pytest
import yaml

from ddpjob.controller import builders
from ddpjob.cli import render as cli_render
from ddpjob.api import spec

pytestmark = pytest.mark.unit

MANIFEST = textwrap.dedent("""\
    apiVersion: ddpjob.dev/v1alpha1
    kind: DDPJob
    metadata:
      name: demo
    spec:
      nnodes: 3
      image: registry/trainer:1
      args: [--epochs, "1"]
    """)


def render(tmp_path, text: str, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    parser = argparse.ArgumentParser()
    cli_render.add_parser(parser.add_subparsers())
    args = parser.parse_args(["render", "-f", str(path), *extra])
    out, err = io.StringIO(), io.StringIO()
    return cli_render.run_render(args, out, err), out.getvalue(), err.getvalue()


def test_render_objects_are_the_builders_objects():
    job = spec.DDPJob(name="demo", namespace="ns", uid=None, spec=spec.DDPJobSpec(nnodes=2, image="i"))
    assert cli_render.render_objects(job) == [builders.build_service(job), *builders.build_pods(job, 0)]


def test_render_yaml_round_trips():
    job = spec.DDPJob(name="demo", namespace="ns", uid="u", spec=spec.DDPJobSpec(nnodes=2, image="i"))
    docs = list(yaml.safe_load_all(cli_render.render_yaml([job], attempt=1)))
    assert docs == cli_render.render_objects(job, attempt=1)


def test_render_a_file(tmp_path):
    code, out, err = render(tmp_path, MANIFEST, "-n", "team-a")
    assert code == 0, err
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["Service", "Pod", "Pod", "Pod"]
    assert [d["metadata"]["name"] for d in docs] == ["demo", "demo-node-0", "demo-node-1", "demo-node-2"]
    from ddpjob.api import validation
    job = validation.parse_ddpjob(yaml.safe_load(MANIFEST), default_namespace="team-a")
    assert docs == cli_render.render_objects(job)  # what the operator would create, exactly
    assert all("ownerReferences" not in d["metadata"] for d in docs)  # no uid before kubectl apply


def test_render_refuses_an_invalid_file(tmp_path):
    code, out, err = render(tmp_path, MANIFEST.replace("nnodes: 3", "nnodes: 0"))
    assert code == 2 and out == "" and "spec.nnodes" in err


@pytest.mark.parametrize("example", ["examples/ddpjob.yaml", "examples/ddpjob-gpu.yaml", "examples/ddpjob-user-script.yaml"])
def test_the_examples_render(example):
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / example
    parser = argparse.ArgumentParser()
    cli_render.add_parser(parser.add_subparsers())
    out, err = io.StringIO(), io.StringIO()
    assert cli_render.run_render(parser.parse_args(["render", "-f", str(path)]), out, err) == 0, err.getvalue()
    pods = [d for d in yaml.safe_load_all(out.getvalue()) if d["kind"] == "Pod"]
    assert len(pods) == 2
    if "gpu" in example:
        assert pods[0]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 8
