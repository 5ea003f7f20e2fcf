"""What moves between roles: the rollout queue, the task board, the weight store and the weight publishers."""
