"""DeviceSpec's named questions about its device agree with the numbers of every preset."""

from __future__ import annotations

import pytest

from tests.helpers import TINY_CPU, device
from workbench.hardware.loader import list_presets


@pytest.mark.parametrize("name", (*list_presets(), TINY_CPU.name))
def test_a_device_either_runs_on_cpu_cores_or_launches_thread_blocks(name):
    spec = device(name)
    assert spec.runs_on_cpu != spec.launches_thread_blocks
    # a CPU core is one "thread" per block (spec.py); a GPU block holds many
    assert spec.launches_thread_blocks == (spec.max_threads_per_block > 1)
