"""Error messages in the dashboard's words.

The core's `UserError`s are written for the CLI (`--shape: 'K=0': K must be a positive integer`,
`--db PATH: ...`), and CLI.md fixes those texts. A form shows them with its own labels instead:
each flag the core names is replaced by the label of the input that set it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Flag (or whole CLI phrase) -> what the dashboard calls that input.
LABELS = {
    "--runner rpc needs --tracker HOST:PORT and --key KEY": "the RPC runner needs a tracker HOST:PORT and a device key",
    "--db": "runs store",
    "--tracker": "tracker",
    "--key": "device key",
    "--workload": "workload",
    "--shape": "shape",
    "--repeat": "repeats per candidate",
    "--topk": "top-K",
    "--out": "bundle directory",
}
_FLAG = re.compile(r"(?<![\w-])--([a-z][a-z0-9-]*)")


def message(err: Exception, labels: Mapping[str, str] | None = None) -> str:
    """`err`'s text with every CLI flag replaced by the dashboard's label for it (`labels` first,
    then `LABELS`; a flag neither knows loses its dashes)."""
    text = str(err)
    for flag, label in sorted({**LABELS, **(labels or {})}.items(), key=lambda kv: -len(kv[0])):
        text = re.sub(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", label, text)
    return _FLAG.sub(r"\1", text)

