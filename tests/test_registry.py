"""The launchers by name (launch/launchers/registry.py): which one a config runs on, asked in
LAUNCHERS' order, and a new launcher taken by its registry line alone."""

from __future__ import annotations

import pytest

from polyrhythm.config import make_config
from polyrhythm.launch.launchers import registry


@pytest.mark.parametrize(("fields", "name"), [
    ({"strategy": "bsp", "workers": 2}, "local"),
    ({"strategy": "bsp", "workers": 2, "hosts": 2}, "emulated"),
    ({"strategy": "bsp", "workers": 2, "launcher": "spark"}, "spark"),
    ({"strategy": "mapreduce", "workers": 2}, "spark"),
])
def test_a_config_runs_on_the_first_launcher_that_claims_it(fields, name):
    assert registry.launcher_of(make_config(fields)).name == name


def test_a_launcher_is_taken_by_its_registry_line_alone(monkeypatch):
    class Elsewhere(registry.Launcher):
        name, title = "elsewhere", "elsewhere"

        def claims(self, config) -> bool:
            return config.workers == 3

    monkeypatch.setattr(registry, "LAUNCHERS",
                        {"elsewhere": Elsewhere(), **registry.LAUNCHERS})
    assert registry.launcher_of(make_config({"strategy": "bsp", "workers": 3})).name == "elsewhere"
    assert registry.launcher_of(make_config({"strategy": "bsp", "workers": 2})).name == "local"
