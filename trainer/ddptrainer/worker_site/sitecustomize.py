"""Run at the start of every Python process the pod entry point (ddptrain-pod) starts: it puts
this folder first on PYTHONPATH. Installs the init guard (ddptrainer.init_guard), the hook
that leaves an uncaught exception's line for the entry point (ddptrainer.uncaught), registers the
stack dump the operator asks for before restarting a stall (ddptrainer.stacks: only when the
entry point set DDPJOB_STACKS_DIR; a SIGUSR1 handler the program installs later wins), then runs
the sitecustomize this one hides, if the image has one. Never fails the process."""
import os
import sys


def _install_guard() -> None:
    if os.environ.get("DDPJOB_INIT_GUARD", "1") == "0":
        return
    try:
        from ddptrainer import init_guard

        init_guard.install_when_imported()
    except Exception as error:  # noqa: BLE001 - a missing guard must not stop the training
        sys.stderr.write(f"ddptrain-pod: init guard: warning: not installed: {error}\n")


def _leave_uncaught_errors() -> None:
    try:
        from ddptrainer import uncaught

        uncaught.install()
    except Exception as error:  # noqa: BLE001 - a missing summary must not stop the training
        sys.stderr.write(f"ddptrain-pod: uncaught errors: warning: not installed: {error}\n")


def _register_stacks() -> None:
    if not os.environ.get("DDPJOB_STACKS_DIR"):
        return
    try:
        from ddptrainer import stacks

        stacks.register_from_environment()
    except Exception as error:  # noqa: BLE001 - a missing dump must not stop the training
        sys.stderr.write(f"ddptrain-pod: stacks: warning: not registered: {error}\n")


def _run_hidden_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None or os.path.abspath(spec.origin or "") == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_install_guard()
_leave_uncaught_errors()
_register_stacks()
_run_hidden_sitecustomize()
