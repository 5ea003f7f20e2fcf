"""Ends a ``python -m pytest`` run of this repository (tests or benchmarks) with the session's status once it is final,
without the interpreter's teardown.

The suites run native runtimes in the pytest process: Ray's core worker, in-process vLLM engines, gloo process groups,
inductor's compile workers. Their teardown at interpreter exit crashed one full-suite run with SIGSEGV (a call to
address 0x30) after every test had passed and the summary was printed, which turned the run's status red. Every
report (the terminal summary, pytest-benchmark's JSON, the cache) is written before `pytest_unconfigure`; this hook
runs last and exits there with the status pytest would return.
"""
from __future__ import annotations

import logging
import os
import sys

import pytest

_SESSION_STATUS: list = []


def _pytest_is_the_program() -> bool:
    """True for ``python -m pytest`` and the ``pytest`` script, False where pytest.main runs inside another program."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return (spec is not None and spec.name.split(".")[0] == "pytest") or \
        os.path.basename(sys.argv[0]) in ("pytest", "py.test")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _SESSION_STATUS.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    if not _SESSION_STATUS or not _pytest_is_the_program():
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(_SESSION_STATUS[-1])
