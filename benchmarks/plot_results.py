"""The PNG figures of benchmarks/README.md, from the JSON results under benchmarks/results/.

    pip install -c ci/constraints.txt -e '.[bench]'    # matplotlib
    python -m benchmarks.plot_results                   # writes benchmarks/figures/*.png

Only the curves a table shows badly are plotted: how the gang's times grow with its size, how
its pod creations overlap, the spread of start latencies, and the many-jobs curves. A results
file that is missing is skipped.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import NullFormatter  # noqa: E402

HERE = Path(__file__).resolve().parent


def load(results: Path, name: str) -> dict | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def caption(data: dict) -> str:
    m = data["machine"]
    return f"{m['nproc']} CPUs, {m['memory_gib']} GiB, {m['date'][:10]}, load {m['loadavg_start'][0]:.1f}"


def gang_size(data: dict, out: Path, capped: dict | None = None) -> None:
    """``capped``: the same benchmark with the pods capped (--pods-cpu-limit), if recorded."""
    summary = data["summary"]
    sizes = sorted(int(s) for s in summary["full"])
    fig, ax = plt.subplots(figsize=(7, 4.5))

    def series(which: str, key: str):
        return [summary[which][str(s)][key] for s in sizes]

    ax.plot(sizes, series("pending", "created_s"), "o-", label="all pods created, pods left Pending")
    ax.plot(sizes, series("full", "created_s"), "s-", label="all pods created, pods starting meanwhile")
    ax.plot(sizes, series("full", "to_all_created_s"), "x:", label="... as a watch saw them")
    if capped is not None:
        cap = capped["params"].get("pods_cpu_limit")
        ax.plot(sizes, [capped["summary"]["full"][str(n)]["created_s"] for n in sizes], "D-.",
                label=f"all pods created, pods starting meanwhile, capped at {cap:g} core")
    ax.plot(sizes, series("full", "to_all_running_s"), "^-", label="all pods Running")
    ax.plot(sizes, series("full", "to_succeeded_s"), "v-", label="DDPJob Succeeded (pods sleep 1 s)")
    anchor = series("full", "to_succeeded_s")[-1]
    ax.plot(sizes, [anchor * s / sizes[-1] for s in sizes], "k--", lw=0.8, label="linear growth")
    ax.axhline(data["params"]["target_created_s"], color="red", lw=0.8, ls="-.", label="target: created < 10 s")
    ax.set(xscale="log", yscale="log", xlabel="nodes (pods) in the gang", ylabel="seconds from the DDPJob's creation",
           title=f"Gang size (median of {data['params']['repeats']}; {caption(data)})")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "gang_size.png", dpi=120)
    plt.close(fig)


def gang_timeline(data: dict, out: Path) -> None:
    biggest = str(max(int(s) for s in data["runs"]["full"]))
    fig, axes = plt.subplots(1, 2, figsize=(9, 4), sharey=True)
    for ax, series, title in zip(axes, ("pending", "full"), ("pods left Pending", "pods starting meanwhile")):
        intervals = data["runs"][series][biggest][0].get("post_intervals") or []
        for i, (start, end) in enumerate(sorted(intervals)):
            ax.plot([start, end], [i, i], lw=1)
        ax.set(xlabel="seconds since the first pod POST", title=f"{biggest} pod POSTs, {title}")
    axes[0].set_ylabel("pod POST (by start time)")
    fig.suptitle(f"Each line is one POST from request received to response (audit log); {caption(data)}",
                 fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gang_post_timeline.png", dpi=120)
    plt.close(fig)


def start_latency(data: dict, out: Path) -> None:
    keys = [("to_all_created_s", "apply -> all\npods created"), ("to_all_running_s", "apply -> all\nRunning"),
            ("last_exit_to_succeeded_s", "last exit ->\nSucceeded"), ("status_latency_s", "pod change ->\nstatus")]
    runs = data["runs"]
    values = [[r[k] for r in runs] if k != "status_latency_s" else [x for r in runs for x in r["status_latencies_s"]]
              for k, _ in keys]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.boxplot(values, whis=(5, 95), showfliers=True)
    ax.set_xticks(range(1, len(keys) + 1), [label for _, label in keys])
    ax.set(ylabel="seconds", title=f"Start latency, {data['params']['runs']} runs of a "
                                   f"{data['params']['nnodes']}-node job ({caption(data)})")
    fig.tight_layout()
    fig.savefig(out / "start_latency.png", dpi=120)
    plt.close(fig)


def many_jobs(data: dict, out: Path, capped: dict | None = None) -> None:
    """``capped``: the same benchmark with the pods capped (--pods-cpu-limit), if recorded."""
    scenarios = data["scenarios"]
    counts = sorted(int(c) for c in scenarios)
    s = [scenarios[str(c)] for c in counts]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(counts, [x["jobs_per_minute"] for x in s], "o-")
    left.set(xscale="log", xlabel="concurrent 4-node jobs", ylabel="jobs finished per minute", title="Throughput")
    right.plot(counts, [x["status_latency_s"]["median"] for x in s], "o-", label="median")
    right.plot(counts, [x["status_latency_s"]["p95"] for x in s], "s--", label="p95")
    if capped is not None:
        cap = capped["params"].get("pods_cpu_limit")
        c = [capped["scenarios"][str(n)]["status_latency_s"] for n in counts]
        right.plot(counts, [x["median"] for x in c], "D-.", label=f"median, pods capped at {cap:g} core")
        right.plot(counts, [x["p95"] for x in c], "v:", label=f"p95, pods capped at {cap:g} core")
    right.axhline(data["params"]["target_status_latency_s"], color="red", lw=0.8, ls="-.", label="target (median)")
    right.set(xscale="log", xlabel="concurrent 4-node jobs", ylabel="seconds",
              title="Pod phase change -> DDPJob status")
    right.legend(fontsize=8)
    for ax in (left, right):
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.xaxis.set_minor_formatter(NullFormatter())
    fig.suptitle(f"Many jobs ({caption(data)})", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "many_jobs.png", dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results-dir", type=Path, default=HERE / "results")
    p.add_argument("--out", type=Path, default=HERE / "figures")
    a = p.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    plots = [("operator_gang_size", gang_size), ("operator_gang_size", gang_timeline),
             ("operator_start_latency", start_latency), ("operator_many_jobs", many_jobs)]
    capped = {name: load(a.results_dir, f"{name}-cpu0.5") for name in ("operator_gang_size", "operator_many_jobs")}
    for name, plot in plots:
        data = load(a.results_dir, name)
        if data is None:
            print(f"skipped {plot.__name__}: no {name}.json")
            continue
        if plot in (gang_size, many_jobs):
            plot(data, a.out, capped[name])
        else:
            plot(data, a.out)
        print(f"wrote {plot.__name__}")


if __name__ == "__main__":
    main()
