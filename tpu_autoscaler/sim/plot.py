"""Pictures of a simulated run: slices by state, chips busy and idle, and pending
work over time."""

from __future__ import annotations

from tpu_autoscaler.sim.metrics import Timeline


def plot_timeline(timeline: Timeline, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [t / 60 for t in timeline.t_s]
    fig, (slices, chips, pending) = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    slices.stackplot(
        minutes,
        timeline.slices["running"],
        timeline.slices["pending"],
        timeline.slices["partial"],
        labels=["running", "provisioning", "partial"],
        colors=["#2b8a3e", "#f59f00", "#e03131"],
    )
    slices.set_ylabel("slices")
    slices.legend(loc="upper right", fontsize=8)
    chips.stackplot(
        minutes,
        timeline.chips_busy,
        timeline.chips_idle,
        labels=["busy", "idle"],
        colors=["#1c7ed6", "#adb5bd"],
    )
    chips.set_ylabel("TPU chips")
    chips.legend(loc="upper right", fontsize=8)
    pending.plot(minutes, timeline.pending, color="#862e9c")
    pending.set_ylabel("pending work")
    pending.set_xlabel("simulated minutes")
    slices.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
