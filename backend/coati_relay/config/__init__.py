"""Keywords -> RunConfig: the schema of every section, the checks, and the build (`build.build_run_config`)."""
