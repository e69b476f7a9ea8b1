"""Test-wide settings: no test reads or writes the user's data directory (runs store, a
calibrated local-cpu spec), so results never depend on what a user did on this machine."""

import pytest


@pytest.fixture(autouse=True)
def private_data_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path_factory.mktemp("xdg-data")))
