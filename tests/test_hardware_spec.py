"""DeviceSpec's named questions about its device agree with the numbers of every preset."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.helpers import TINY_CPU, device, plain_matmul
from workbench.errors import UserError
from workbench.hardware.loader import list_presets, load_spec
from workbench.hardware.parse import spec_from_toml_text
from workbench.hardware.spec import DeviceSpec, MemoryLayer
from workbench.hardware.write import spec_to_toml
from workbench.rtile.rprogram import layer_capacity, layer_footprint
from workbench.rtile.traffic import calculus


@pytest.mark.parametrize("name", (*list_presets(), TINY_CPU.name))
def test_a_device_either_runs_on_cpu_cores_or_launches_thread_blocks(name):
    spec = device(name)
    assert spec.runs_on_cpu != spec.launches_thread_blocks
    # a CPU core is one "thread" per block (spec.py); a GPU block holds many
    assert spec.launches_thread_blocks == (spec.max_threads_per_block > 1)


# A small GPU in the shape of the NVIDIA presets (registers, block-shared memory, global memory;
# float16 tensor cores), built here so that the tests below hold whatever machine runs them.
TINY_GPU = DeviceSpec(
    name="tiny-gpu",
    kind="gpu",
    vendor="nvidia",
    layers=(
        MemoryLayer("registers", "thread", 96 * 4, 20000.0, 4, 2.6),
        MemoryLayer("shared", "unit", 48 * 1024, 12000.0, 4, 12.0, banks=32, bank_width_bytes=4),
        MemoryLayer("global", "device", 2**32, 750.0, 32, 400.0),
    ),
    compute_units=8,
    warp_size=32,
    teu_per_unit=4,
    max_threads_per_block=512,
    max_threads_per_unit=2048,
    registers_per_thread_cap=96,
    registers_per_unit=65536,
    peak_gflops=(("float32", 1000.0),),
    tensor_core_gflops=(("float16", 8000.0),),
    tensor_core_fragment=(16, 16, 16),
)


def test_gpu_lanes_are_threads_cpu_lanes_are_simd_lanes():
    assert TINY_GPU.lanes_are_threads
    assert not TINY_CPU.lanes_are_threads


def test_a_register_is_32_bits_per_gpu_thread_and_a_vector_register_on_a_cpu():
    assert TINY_GPU.register_bytes == 4
    assert TINY_CPU.register_bytes == 4 * TINY_CPU.warp_size == 64
    # the register cap bounds the top layer in registers of that size (28 x 64 B = 1792 B)
    assert layer_capacity(TINY_CPU, 0) == TINY_CPU.registers_per_thread_cap * TINY_CPU.register_bytes == 1792
    smaller_cap = replace(TINY_CPU, registers_per_thread_cap=10)
    assert layer_capacity(smaller_cap, 0) == 10 * 64
    assert layer_capacity(replace(TINY_GPU, registers_per_thread_cap=64), 0) == 64 * 4


def test_fma_accumulators_are_latency_times_pipes_on_cpus_only():
    """Little's law: latency x pipes FMAs in flight, one per independent accumulator."""
    zen2 = replace(TINY_CPU, fma_latency_cycles=5, fma_pipes=2)
    assert (zen2.fma_accumulators, replace(zen2, fma_latency_cycles=4).fma_accumulators) == (10, 8)
    assert TINY_CPU.fma_accumulators == 0  # a spec stating no FMA facts asks for no accumulators
    assert replace(TINY_GPU, fma_latency_cycles=4, fma_pipes=2).fma_accumulators == 0


def test_a_cpu_register_tile_takes_whole_vector_registers():
    """C[i, j] += A[i, k] B[k, j] in a 6 x 16 fp32 tile on 16 lanes: 6 accumulators, one vector
    of B, one broadcast of A: 8 registers of 64 B (not the 6 + 16 + 96 scalars' 472 B)."""
    e = plain_matmul(64, 64, 64)
    assert layer_footprint(calculus(e), TINY_CPU, 0, (6, 16, 1)) == 8 * 64
    assert layer_footprint(calculus(e), TINY_CPU, 0, (6, 16, 4)) == 8 * 64  # the reduce step reuses them
    assert layer_footprint(calculus(e), TINY_GPU, 0, (6, 16, 1)) == (6 + 16 + 96) * 4  # scalar registers


def test_only_the_gpu_unit_layer_tiles_a_thread_block():
    assert [TINY_GPU.is_thread_block_layer(i) for i in range(3)] == [False, True, False]
    # a CPU core's work item (its L2 tile, the last per-unit layer) runs on one thread
    assert TINY_CPU.unit_layer_index == 2
    assert not any(TINY_CPU.is_thread_block_layer(i) for i in range(len(TINY_CPU.layers)))


def test_block_shared_memory_stages_inputs_only_cpu_caches_hold_the_output_too():
    assert [TINY_GPU.is_block_shared(i) for i in range(3)] == [False, True, False]
    assert not any(TINY_CPU.is_block_shared(i) for i in range(len(TINY_CPU.layers)))
    calc = calculus(plain_matmul(256, 256, 256))
    tile = (32, 32, 8)  # A 32x8, B 8x32, C 32x32 float32
    inputs, output = 2 * 32 * 8 * 4, 32 * 32 * 4
    assert layer_footprint(calc, TINY_GPU, 1, tile) == inputs
    assert layer_footprint(calc, TINY_CPU, 1, tile) == layer_footprint(calc, TINY_CPU, 2, tile) == inputs + output


def test_occupancy_limits_apply_to_thread_blocks_not_to_cpu_cores():
    assert TINY_GPU.has_occupancy_limits
    assert not TINY_CPU.has_occupancy_limits


def test_virtual_threads_exist_only_where_thread_blocks_do():
    assert TINY_GPU.has_virtual_threads
    assert not TINY_CPU.has_virtual_threads


def test_tensor_cores_need_a_gpu_a_fragment_and_a_peak_for_the_dtype():
    assert TINY_GPU.has_tensor_cores("float16")
    assert not TINY_GPU.has_tensor_cores("float32")  # no MMA peak for float32: the plain ALUs
    assert not replace(TINY_GPU, tensor_core_fragment=()).has_tensor_cores("float16")
    # a CPU spec stating MMA numbers still has none the code generators use
    mma_cpu = replace(TINY_CPU, tensor_core_gflops=(("float16", 1000.0),), tensor_core_fragment=(16, 16, 16))
    assert not mma_cpu.has_tensor_cores("float16")


# -- occupancy fields: resident blocks, shared memory per unit, L2 ---------------------------------

# (preset, max_blocks_per_unit, shared_bytes_per_unit, l2_bytes): CUDA C++ Programming Guide,
# technical specifications per compute capability (7.0, 8.0, 9.0, 3.7, 8.9, 8.7) and the
# architecture whitepapers, as the spec files' [sources] say; the MI50 states no block limit.
OCCUPANCY = [
    ("v100", 32, 96 * 1024, 6 * 2**20),
    ("a100", 32, 164 * 1024, 40 * 2**20),
    ("h100", 32, 228 * 1024, 50 * 2**20),
    ("h200", 32, 228 * 1024, 60 * 2**20),  # as the H200 reports it (specs/devices/h200.toml)
    ("k80", 16, 112 * 1024, 1536 * 1024),
    ("rtx4090", 24, 100 * 1024, 72 * 2**20),
    ("orin-nano", 16, 164 * 1024, 0),
    ("mi50", 0, 64 * 1024, 4 * 2**20),
]


@pytest.mark.parametrize("name, blocks, shared, l2", OCCUPANCY)
def test_gpu_presets_state_their_occupancy_limits(name, blocks, shared, l2):
    spec = device(name)
    assert (spec.max_blocks_per_unit, spec.shared_bytes_per_unit, spec.l2_bytes) == (blocks, shared, l2)
    assert spec.unit_shared_bytes == shared >= spec.layers[spec.unit_layer_index].capacity_bytes
    sourced = dict(spec.sources)
    stated = ("shared_bytes_per_unit",) + (("max_blocks_per_unit",) if blocks else ()) + (("l2_bytes",) if l2 else ())
    assert all(sourced.get(key, "").strip() for key in stated)


def test_unit_shared_bytes_falls_back_to_one_blocks_capacity():
    assert TINY_GPU.shared_bytes_per_unit == 0 and TINY_GPU.unit_shared_bytes == 48 * 1024
    assert replace(TINY_GPU, shared_bytes_per_unit=96 * 1024).unit_shared_bytes == 96 * 1024
    assert (TINY_CPU.max_blocks_per_unit, TINY_CPU.shared_bytes_per_unit, TINY_CPU.l2_bytes) == (0, 0, 0)


V100_TEXT = spec_to_toml(load_spec("v100", check_target=False))
BROKEN_OCCUPANCY = [
    ("max_blocks_per_unit = 32\n", "max_blocks_per_unit = -1\n", "device.max_blocks_per_unit must be an integer >= 0, got -1"),
    ("max_blocks_per_unit = 32\n", 'max_blocks_per_unit = "32"\n', "device.max_blocks_per_unit must be an integer >= 0, got '32'"),
    ("max_blocks_per_unit = 32\n", "max_blocks_per_unit = 4096\n",
     "device.max_blocks_per_unit (4096) must not exceed device.max_threads_per_unit (2048): a block has at least one thread"),
    ("shared_bytes_per_unit = 98304\n", "shared_bytes_per_unit = 1.5\n", "device.shared_bytes_per_unit must be an integer >= 0, got 1.5"),
    ("shared_bytes_per_unit = 98304\n", "shared_bytes_per_unit = 4096\n",
     "device.shared_bytes_per_unit (4096) must not be below the unit layer's capacity_bytes (49152): "
     "one block's shared memory is part of its unit's"),
    ("l2_bytes = 6291456\n", "l2_bytes = true\n", "device.l2_bytes must be an integer >= 0, got True"),
]


@pytest.mark.parametrize("old, new, message", BROKEN_OCCUPANCY, ids=[case[2][:40] for case in BROKEN_OCCUPANCY])
def test_bad_occupancy_fields_are_one_line_errors(old, new, message):
    assert V100_TEXT.count(old) == 1, old
    with pytest.raises(UserError) as info:
        spec_from_toml_text(V100_TEXT.replace(old, new), label="spec v100.toml", check_target=False)
    assert str(info.value) == f"spec v100.toml: {message}"


def test_occupancy_fields_are_optional_on_a_gpu_and_refused_on_a_cpu():
    """A spec written before the fields loads (no block limit, one block's shared memory, no L2
    order); a CPU spec that states one is refused."""
    fields = ("max_blocks_per_unit =", "shared_bytes_per_unit =", "l2_bytes =")
    text = "".join(line + "\n" for line in V100_TEXT.splitlines() if not line.startswith(fields))
    old = spec_from_toml_text(text, check_target=False)
    assert (old.max_blocks_per_unit, old.shared_bytes_per_unit, old.l2_bytes) == (0, 0, 0)
    cpu = spec_to_toml(load_spec("xeon-avx512", check_target=False))
    assert "max_blocks_per_unit = 0\n" in cpu
    with pytest.raises(UserError, match=r"^spec: device.max_blocks_per_unit describes a GPU: 0 \(or absent\) on a CPU$"):
        spec_from_toml_text(cpu.replace("max_blocks_per_unit = 0\n", "max_blocks_per_unit = 8\n"), check_target=False)


def test_a_rooflines_ceilings_are_the_layers_and_a_cpus_last_level_cache_above_the_bottom():
    """`DeviceSpec.ceilings`: each layer's bandwidth in order, and where a CPU spec names a
    last-level cache its bandwidth between the per-core caches and the bottom layer, whose reads
    it serves for an operator it holds; the roofline draws one ceiling each."""
    from workbench.viz.roofline import roofline_figure

    plain = tuple((layer.name, layer.bandwidth_gbps) for layer in TINY_CPU.layers)
    assert TINY_CPU.ceilings() == plain
    llc = replace(TINY_CPU, llc_bytes=64 * 1024**2, llc_gbps=55.0)
    assert llc.ceilings() == plain[:-1] + (("LLC", 55.0),) + plain[-1:]
    names = [t.name for t in roofline_figure(llc.ceilings(), 200.0).data]
    assert [n.split()[0] for n in names[:len(plain) + 1]] == [n for n, _ in llc.ceilings()]
