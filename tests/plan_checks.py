"""What two capacity plans must share to be the same plan (``CapacityPlan.save``/``load``)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import sim


def assert_same_plan(got: sim.CapacityPlan, want: sim.CapacityPlan) -> None:
    """Every field of two plans equal: tables (dtypes included), waits bit for bit, the answer."""
    pd.testing.assert_frame_equal(got.grid, want.grid, check_exact=True)
    pd.testing.assert_frame_equal(got.confirmation, want.confirmation, check_exact=True)
    assert (got.target, got.sizes, got.engine, got.recommended) == (
        want.target, want.sizes, want.engine, want.recommended
    )  # fmt: skip
    assert (got.scenario_name, got.confirmation_note) == (
        want.scenario_name, want.confirmation_note
    )  # fmt: skip
    assert len(got.replications) == len(want.replications)
    for a, b in zip(got.replications, want.replications, strict=True):
        assert np.array_equal(a.waits, b.waits) and a.waits.dtype == b.waits.dtype
        assert {**vars(a), "waits": None} == {**vars(b), "waits": None}
    assert got.headline() == want.headline()
    assert got.confirmation_check() == want.confirmation_check()
