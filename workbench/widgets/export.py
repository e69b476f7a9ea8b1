"""ExportButton: build one candidate, check it, and write its bundle with `pipeline.export`, the
export `workbench export` and the dashboard call (built and checked in a worker process)."""

from __future__ import annotations

from html import escape
from pathlib import Path

import ipywidgets as widgets
import traitlets

from workbench import pipeline
from workbench.errors import UserError
from workbench.pipeline import Construction, ExportResult, Kernel, Workload
from workbench.widgets.candidates import candidates_of, rank_options
from workbench.widgets.tables import message


class ExportButton(widgets.VBox):
    """Pick a candidate (`rank`), press Export: the bundle lands in `folder`/<bundle name> (the
    operator, device, policy and rank: `pipeline.bundle_name_for`; a zip with `zip`); `path` is where it went, `verified` whether the kernel itself ran here and
    matched numpy (a kernel for a GPU or CPU not here is exported unverified, and its manifest
    says why). `measured` (rank -> seconds) goes into the manifest. `workload`, the request's
    where it is an operator of an ONNX model, has the kernel checked in a run of the model."""

    rank = traitlets.Int(1)
    path = traitlets.Unicode("")
    verified = traitlets.Bool(False)
    measured = traitlets.Dict()

    def __init__(self, construction: Construction, rank: int = 1, folder: str | Path = "bundles", zip: bool = False,
                 workload: Workload | None = None):
        self.construction, self.workload = construction, workload
        self.by_rank = {c.rank: c for c in candidates_of(construction)}
        self.kernel: Kernel | None = None  # the last exported kernel, as built (no executable)
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
        """Build, check and export the picked candidate (what the button does); the bundle's
        path, or None with the reason shown."""
        c = self.construction
        cand = self.by_rank[self.rank]
        self.button.disabled = True
        self.path, self.verified = "", False
        try:
            self.status.value = message(f"building and checking candidate {cand.rank}...")
            name = pipeline.bundle_name_for(c, cand.rank, c.expr.op)
            out = Path(self.folder.value.strip() or ".").expanduser() / name
            result = pipeline.export(c, cand.rank, out, zip=self.zip_box.value,
                                     measured_seconds=self.measured.get(cand.rank), workload=self.workload)
        except UserError as err:  # a refused path, or a kernel refused (KernelRejected)
            self.status.value = message(str(err), "error")
            return None
        finally:
            self.button.disabled = False
        self.kernel = result.kernel
        self.path, self.verified = str(result.path), result.verified
        self.status.value = self._written(result)
        return result.path

    @staticmethod
    def _written(result: ExportResult) -> str:
        text = message(f"Wrote {result.path} ({result.summary()})", "ok")
        if result.path.is_dir():
            text += f"<p><small>{escape(', '.join(sorted(p.name for p in result.path.iterdir())))}</small></p>"
        return text
