from tests.db.conftest import advert, contract


def test_submit_201_then_202_then_422(med):
    advert(med, "X")
    a = med.submit(contract("a"))
    assert (a.status, a.run.state) == (201, "RUNNING")
    b = med.submit(contract("b"))
    assert (b.status, b.run.state) == (202, "QUEUED")
    c = med.submit(contract("c", dut={"board": "nope"}))
    assert (c.status, c.run.state, c.run.verdict) == (422, "FAILED", "rejected")
    [w] = med.work("X")
    st = med.claim("a", w.seq, "X")
    r = med.report("a", st.seq, "X", st.attempt, "pass", log="ok")
    assert r.settled == "PASSED"
    assert med.get_run("b").state == "RUNNING"
    assert med.records.verify("a").ok
