"""The Ray side: placement, liveness, bounded waits, the environment of actors, devices, heap trimming."""
