from tests.db.conftest import advert, contract


def test_submit_201_then_202_then_422(med):
    advert(med, "X")
    a = med.submit(contract("a"))
    assert (a.status, a.run.state) == (201, "RUNNING")
    b = med.submit(contract("b"))
    assert (b.status, b.run.state) == (202, "QUEUED")
    c = med.submit(contract("c", dut={"board": "nope"}))
    assert (c.status, c.run.state, c.run.verdict) == (422, "FAILED", "rejected")
