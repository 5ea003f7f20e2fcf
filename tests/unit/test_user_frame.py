"""Warnings about the user's configuration point at the user's call (or at the YAML file `coati-relay run` read),
not at a line of coati-relay."""
from __future__ import annotations

import warnings

from coati_relay.assembly.build import HostDifferenceWarning, warn_host_differences
from coati_relay.config.user_frame import config_file


def _caught(call):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [w for w in caught if issubclass(w.category, HostDifferenceWarning)]


def test_a_host_difference_points_at_the_line_that_called_into_coati_relay():
    [warned] = _caught(lambda: warn_host_differences(["no CUDA: fp32"]))  # this line
    assert warned.filename == __file__
    assert "warn_host_differences" in open(__file__).read().splitlines()[warned.lineno - 1]
    assert "no CUDA: fp32" in str(warned.message)


def test_under_the_cli_it_points_at_the_config_file(tmp_path):
    config = tmp_path / "grpo.yaml"
    with config_file(str(config)):
        [warned] = _caught(lambda: warn_host_differences(["no CUDA: fp32"]))
    assert (warned.filename, warned.lineno) == (str(config), 1)
    [after] = _caught(lambda: warn_host_differences(["x"]))
    assert after.filename == __file__, "only while the CLI's config is being run"
