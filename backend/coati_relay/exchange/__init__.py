"""What moves between roles: the rollout queue, the task board, the weight store and the weight publishers. Each weight
sync registers a `WeightSyncSpec` (`coati_relay.exchange.sync_registry`), looked up by name with `weight_sync_spec`."""
from coati_relay.exchange import weight_sync, weight_sync_collective  # noqa: F401  (they register in this order)
