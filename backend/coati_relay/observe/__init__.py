"""What a run reports: metrics, trackers, plots, rollout and evaluation logs, profiling."""
