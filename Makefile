# One-line entry points; each calls a script under scripts/ that does the work.
.PHONY: setup example test test-unit generate build-control-plane e2e-kind bench

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

e2e-kind:         ## the end-to-end suite against a kind cluster (needs Docker and kind)
	bash scripts/e2e-kind.sh
