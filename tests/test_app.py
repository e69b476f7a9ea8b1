"""Dashboard pages render on the default workload and stepping follows the core stepper."""

from pathlib import Path

from streamlit.testing.v1 import AppTest

from workbench.construct.stepper import Stepper
from workbench.hardware.loader import load_spec
from workbench.workload import suite_workload

ROOT = Path(__file__).resolve().parent.parent


def page(name: str) -> AppTest:
    return AppTest.from_file(str(ROOT / "workbench" / "app" / name), default_timeout=60)


def test_workload_page_renders():
    at = page("page_workload.py").run()
    assert not at.exception
    assert at.title[0].value == "Workload"


def test_construction_page_steps_like_the_core():
    at = page("page_construction.py").run()
    assert not at.exception
    core = Stepper(suite_workload("cpu-core:mm-512").build(), load_spec("local-cpu"))
    for _ in range(3):
        at.button[2].click().run()  # Next
        core.next()
    assert "Step 3" in at.markdown[0].value
    assert core.current.note in at.markdown[1].value
    at.button[1].click().run()  # Back
    core.back()
    assert "Step 2" in at.markdown[0].value and core.current.note in at.markdown[1].value


def test_candidates_page_lists_topk():
    at = page("page_candidates.py").run()
    assert not at.exception
    assert len(at.dataframe[0].value) == 10


def test_bad_expression_shows_an_error_and_keeps_the_selection():
    at = page("page_workload.py").run()
    at.radio[0].set_value("Expression").run()
    at.text_input[0].set_value("C[i] = __import__('os')")
    at.button[0].click().run()  # a form's values are sent with its submit button
    assert not at.exception
    assert at.error, "a malformed expression must show an error element"
    assert "cpu-core:mm-512" in at.caption[0].value
