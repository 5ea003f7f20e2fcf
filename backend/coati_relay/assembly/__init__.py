"""A run's assembly: `build.build_run_config` checks the launch keywords against the schema (`coati_relay.config`)
and against the registered inference backends and weight syncs (their specs), and returns the `RunConfig`. It sits
above every part it consults; `coati_relay.config` sits below them all."""
