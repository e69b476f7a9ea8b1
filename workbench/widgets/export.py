"""ExportButton: build one candidate, check it against numpy on a CPU, and write its bundle,
the way `workbench export` does (build_candidate, verify, export_bundle)."""

from __future__ import annotations

import re
from html import escape
from pathlib import Path

import ipywidgets as widgets
import traitlets

from workbench.codegen.build import Kernel, build_candidate
from workbench.codegen.export import export_bundle
from workbench.codegen.verify import Verification, verify
from workbench.construct.step import Candidate
from workbench.construct.stepper import Construction
from workbench.errors import UserError
from workbench.widgets.candidates import candidates_of, rank_options
from workbench.widgets.tables import message


def bundle_name(construction: Construction, rank: int) -> str:
    """A file-system-safe bundle name: operator, device, policy, rank."""
    raw = f"{construction.expr.op}-{construction.device.name}-{construction.policy}-rank{rank}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-.")


class ExportButton(widgets.VBox):
    """Pick a candidate (`rank`), press Export: the bundle lands in `folder`/<bundle name> (a
    zip with `zip`); `path` is where it went, `verified` whether it was run against numpy (a GPU
    kernel is exported unverified). `measured` (rank -> seconds) goes into the manifest."""

    rank = traitlets.Int(1)
    path = traitlets.Unicode("")
    verified = traitlets.Bool(False)
    measured = traitlets.Dict()

    def __init__(self, construction: Construction, rank: int = 1, folder: str | Path = "bundles", zip: bool = False):
        self.construction = construction
        self.by_rank = {c.rank: c for c in candidates_of(construction)}
        self.kernel: Kernel | None = None
        self.picker = widgets.Dropdown(options=rank_options(self.by_rank.values()), description="candidate")
        self.folder = widgets.Text(value=str(folder), description="folder")
        self.zip_box = widgets.Checkbox(value=zip, description="zip", indent=False)
        self.button = widgets.Button(description="Export", icon="download", button_style="primary")
        self.status = widgets.HTML(message("Press Export to build, check and write the bundle."))
        super().__init__(children=[widgets.HBox([self.picker, self.folder, self.zip_box, self.button]), self.status])
        traitlets.link((self, "rank"), (self.picker, "value"))
        self.rank = rank
        self.button.on_click(lambda _: self.export())

    def export(self) -> Path | None:
        """Build, verify (CPU) and export the picked candidate (what the button does); the
        bundle's path, or None with the reason shown."""
        cand = self.by_rank[self.rank]
        self.button.disabled = True
        self.path, self.verified = "", False
        try:
            self.status.value = message(f"building candidate {cand.rank}...")
            path, checked = self._export(cand)
        except UserError as err:
            self.status.value = message(str(err), "error")
            return None
        except OSError as err:
            self.status.value = message(f"cannot write the bundle: {err.strerror or err}", "error")
            return None
        finally:
            self.button.disabled = False
        self.path, self.verified = str(path), checked is not None
        self.status.value = self._written(path, checked)
        return path

    def _export(self, cand: Candidate) -> tuple[Path, Verification | None]:
        c = self.construction
        self.kernel = build_candidate(c.expr, cand, c.device)
        if not self.kernel.ok:
            raise UserError(f"candidate {cand.rank} did not build, nothing exported: {self.kernel.error}")
        checked = verify(self.kernel, c.expr) if c.device.kind == "cpu" else None
        if checked is not None and not checked.correct:
            raise UserError(f"candidate {cand.rank} gives wrong results, nothing exported: {checked.error}")
        out = Path(self.folder.value.strip() or ".").expanduser() / bundle_name(c, cand.rank)
        path = export_bundle(self.kernel, c.expr, cand.program, c.device, out, policy=c.policy, rank=cand.rank,
                             predicted_seconds=cand.predicted_seconds, measured_seconds=self.measured.get(cand.rank),
                             zip=self.zip_box.value)
        return path, checked

    @staticmethod
    def _written(path: Path, checked: Verification | None) -> str:
        how = (f"checked against numpy (max abs error {checked.max_abs_err:.3g})" if checked is not None
               else "not run: no such device here")
        text = message(f"Wrote {path} ({how})", "ok")
        if path.is_dir():
            text += f"<p><small>{escape(', '.join(sorted(p.name for p in path.iterdir())))}</small></p>"
        return text
