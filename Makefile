# One-line entry points; each calls a script under scripts/ that does the work.
.PHONY: setup example test test-unit generate build-control-plane build-kueue images push kind-up kind-down e2e-kind bench

setup:            ## install the project with pinned dependencies
	bash scripts/setup.sh

example: setup    ## run examples/ddpjob.yaml on this machine (2 nodes, CPU, gloo), no cluster
	ddpjob run -f examples/ddpjob.yaml

test:             ## every test tier this machine can run (what CI runs)
	bash scripts/test.sh

test-unit: setup  ## the fast tier only
	python3 -m pytest -m unit -q

generate:         ## regenerate manifests/crd.yaml and docs/api.md from the API model
	python3 -m ddpjob.api.generate

build-control-plane:  ## build etcd + kube-apiserver/controller-manager/scheduler once (cached)
	bash scripts/build-control-plane.sh

build-kueue:      ## build Kueue v0.17.0's controller manager once (cached) for the Kueue tests
	bash scripts/build-kueue.sh

images:           ## the trainer and operator images (offline: Debian base + wheels from PyPI)
	bash scripts/images.sh

push:             ## tag and push the images to your registry: make push REGISTRY=registry.example.com/team
	bash scripts/push-images.sh

kind-up:          ## a kind cluster (1 control-plane + 2 workers) running the operator
	bash scripts/kind/up.sh

kind-down:        ## delete it and stop the project's dockerd (caches stay)
	bash scripts/kind/down.sh

e2e-kind:         ## kind-up, the end-to-end suite against it, kind-down
	bash scripts/e2e-kind.sh
