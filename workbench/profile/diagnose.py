"""Why a kernel took the time it did: its measured rates against the device's roofs, stage by
stage, as Nsight Compute's speed-of-light section reports them.

For a measured time t the kernel achieved `flops / t` (the operator's useful FLOPs) and moved
`bytes_per_layer[l] / t` from each layer the model says it reads. Each is a share of that roof
(the peak for the expression, the layer's bandwidth; for a CPU operator the last-level cache
holds, the bottom layer's reads against that cache's bandwidth, as the model prices them,
`common.stays_in_llc`). The highest share is the limit that binds
(if any is near its roof); when every share is low, no roof binds and time goes to latency and
overhead: loop control, unvectorised or spilled code, too few independent accumulators, launch
and synchronisation. The model's own stages (compute, loads per layer, from the `Estimate`) are
put beside the measurement, so a face can say which stage the model got wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.hardware.spec import DeviceSpec
from workbench.rtile.model import Estimate

GB = 1e9
# A roof counts as binding from this share of it on: measured streaming reads and FMA loops reach
# 70-90 % of the spec's peaks (the calibrations in docs/benchmarks.md as of commit 2437a60), so
# 60 % is within reach of one.
BINDING_SHARE = 0.6
# Measured within this factor of the prediction counts as "as predicted" (timing noise on a
# shared machine alone spreads repeats by 10-50 %, profile/noise.py).
AS_PREDICTED = 1.5


@dataclass(frozen=True)
class Diagnosis:
    """One measured candidate against the roofs: `shares[name]` is the achieved fraction of
    that roof ("compute" and each layer read), `binding` the roof it presses against (or
    "latency/overhead"), `ratio` measured / predicted, `stages` the model's seconds per stage;
    `gbps` the achieved bandwidth per layer read, `peaks` each roof (GFLOP/s, GB/s), which are the
    spec's measured ones where it was calibrated on this machine (`calibrated`); `llc_serves` the
    bottom layer whose reads the last-level cache serves, its roof that cache's bandwidth."""

    gflops: float
    shares: tuple[tuple[str, float], ...]
    binding: str
    ratio: float
    predicted_bottleneck: str
    stages: tuple[tuple[str, float], ...]
    gbps: tuple[tuple[str, float], ...] = ()
    peaks: tuple[tuple[str, float], ...] = ()
    calibrated: bool = False
    llc_serves: str = ""

    @property
    def compute_share(self) -> float:
        return dict(self.shares)["compute"]

    @property
    def bandwidth_share(self) -> tuple[str, float] | None:
        """(layer, share) of the layer read closest to its roof; None when no layer is read."""
        layers = [(name, share) for name, share in self.shares if name != "compute"]
        return max(layers, key=lambda kv: kv[1]) if layers else None

    @property
    def peak_text(self) -> str:
        """"41% of peak compute (12.3 GFLOP/s), DRAM 30% (52.1 GB/s); binds compute"."""
        parts = [f"{self.compute_share:.0%} of peak compute ({self.gflops:.3g} GFLOP/s)"]
        if (top := self.bandwidth_share) is not None:
            parts.append(f"{self._layer(top[0])} {top[1]:.0%} ({dict(self.gbps)[top[0]]:.3g} GB/s)")
        peaks = "calibrated" if self.calibrated else "spec"
        return ", ".join(parts) + f" of the {peaks} peaks; binds {self._layer(self.binding)}"

    @property
    def sentence(self) -> str:
        shares = dict(self.shares)
        parts = ", ".join(f"{share:.0%} of {'peak compute' if name == 'compute' else self._roof(name)}"
                          for name, share in sorted(shares.items(), key=lambda kv: -kv[1]))
        speed = ("as predicted" if 1 / AS_PREDICTED <= self.ratio <= AS_PREDICTED
                 else f"{self.ratio:.3g}x {'slower' if self.ratio > 1 else 'faster'} than predicted")
        if self.binding == LATENCY:
            why = ("no roof binds: the time goes to latency and overhead (loop control, unvectorised or spilled "
                   "code, too few independent accumulators, launches), which the model does not price")
        elif self.binding == self.predicted_bottleneck:
            why = f"{self._roof(self.binding)} binds, as the model predicted"
        else:
            why = f"{self._roof(self.binding)} binds where the model predicted {self._roof(self.predicted_bottleneck)}"
        return f"{speed}; it reaches {parts}: {why}"

    def _layer(self, name: str) -> str:
        return f"{name} (from the last-level cache)" if name == self.llc_serves else name

    def _roof(self, name: str) -> str:
        return "compute" if name == "compute" else f"{self._layer(name)} bandwidth"

    def to_dict(self) -> dict:
        return {"achieved_gflops": self.gflops, "roof_shares": dict(self.shares), "binding": self.binding,
                "measured_over_predicted": self.ratio, "predicted_bottleneck": self.predicted_bottleneck,
                "predicted_stages_seconds": dict(self.stages), "achieved_gbps": dict(self.gbps),
                "peaks": dict(self.peaks), "peaks_from": "calibrated" if self.calibrated else "spec",
                "llc_serves": self.llc_serves or None,
                "sentence": self.sentence}


LATENCY = "latency/overhead"


def diagnose(estimate: Estimate, device: DeviceSpec, peak_gflops: float, seconds: float,
             in_llc: bool = False) -> Diagnosis:
    """The diagnosis of a kernel predicted by `estimate` and measured at `seconds` on `device`,
    whose compute roof for the expression is `peak_gflops`; `in_llc`: the operator stays in the
    CPU's last-level cache (`common.stays_in_llc`), which then serves the bottom layer's reads."""
    if seconds <= 0:
        raise ValueError(f"a measured time must be positive, got {seconds}")
    gflops = estimate.flops / seconds / GB
    shares = {"compute": gflops / peak_gflops}
    layers = {layer.name: layer.bandwidth_gbps for layer in device.layers}
    served = device.layers[-1].name if in_llc and device.runs_on_cpu and device.llc_gbps else ""
    if served:
        layers[served] = device.llc_gbps
    gbps, peaks = {}, {"compute": peak_gflops}
    for name, moved in estimate.bytes_per_layer:
        if name in layers:  # a CPU's panel copies are a stage of the model's, not a roof
            gbps[name] = moved / seconds / GB
            peaks[name] = layers[name]
            shares[name] = gbps[name] / peaks[name]
    top = max(shares, key=shares.get)
    binding = top if shares[top] >= BINDING_SHARE else LATENCY
    stages = (("compute", estimate.compute_seconds),) + tuple(estimate.load_seconds)
    return Diagnosis(gflops, tuple(shares.items()), binding, seconds / estimate.predicted_seconds,
                     estimate.bottleneck, stages, tuple(gbps.items()), tuple(peaks.items()), device.calibrated,
                     served if served in gbps else "")
