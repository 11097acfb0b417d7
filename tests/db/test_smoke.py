from mediator import Outcome
from tests.db.conftest import advert, contract


def test_submit_201_then_202_then_422(med):
    advert(med, "X")
    a = med.submit(contract("a"))
    assert (a.outcome, a.run.state) == (Outcome.STARTED, "RUNNING")
    b = med.submit(contract("b"))
    assert (b.outcome, b.run.state) == (Outcome.QUEUED, "QUEUED")
    c = med.submit(contract("c", dut={"board": "nope"}))
    assert (c.outcome, c.run.state, c.run.verdict) == (Outcome.REJECTED, "FAILED", "rejected")
    [w] = med.work("X")
    st = med.claim("a", w.seq, "X")
    r = med.report("a", st.seq, "X", st.attempt, "pass", log="ok")
    assert r.settled == "PASSED"
    assert med.get_run("b").state == "RUNNING"
    assert med.records.verify("a").ok
