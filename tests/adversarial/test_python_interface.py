"""The same refusals through the Python interface (design.md §19) that the simulator and notebooks
use: text that cannot be stored is a ContractError naming the field before anything is written,
and a step's log is stored escaped (issue 11 §3; docs/security.md, "Text")."""

from __future__ import annotations

import pytest

from mediator import ContractError, Mediator

pytestmark = [pytest.mark.db]


@pytest.fixture
def med(dsn, tmp_path):
    m = Mediator.connect(dsn, records_root=str(tmp_path / "records"))
    yield m
    m.close()


def contract(run_id: str, **step: object) -> dict[str, object]:
    return {
        "run_id": run_id,
        "roles": {"dut": {"kit": "k"}},
        "steps": [{"name": "flash", "role": "dut", "with": {"cmd": "true"}, **step}],
    }


@pytest.mark.parametrize("junk", ["a\x00b", "a\udc00b"])
def test_advert_text_that_cannot_be_stored_is_refused_naming_the_field(med, junk):
    for field, kwargs in [("label", {"label": junk}), ("instance", {"instance": junk})]:
        args = {"instance": "i1", **kwargs}
        with pytest.raises(ContractError) as e:
            med.advert("n1", {"kit": "k"}, **args)
        assert e.value.field == field
    assert med.list_nodes().nodes == ()


@pytest.mark.parametrize("run_id", ["..", ".", ".x"])
def test_a_dot_run_id_is_refused_and_nothing_is_written(med, tmp_path, run_id):
    med.advert("n1", {"kit": "k"}, "i1")
    with pytest.raises(ContractError) as e:
        med.submit(contract(run_id))
    assert e.value.field == "run_id"
    assert med.list_runs().runs == ()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["records"]


def test_a_log_with_nul_and_surrogates_is_stored_escaped(med, tmp_path):
    med.advert("n1", {"kit": "k"}, "i1")
    med.submit(contract("r1"))
    step = med.claim("r1", 0, "n1")
    med.report("r1", 0, "n1", step.attempt, "pass", log="out\x00put \udc80!")
    assert med.get_run("r1").state == "PASSED"
    log = tmp_path / "records" / "r1" / "steps" / "0000-flash.log"
    assert log.read_text("utf-8") == "out\u2400put \ufffd!"
