"""What `sim` hands to people and CI (layer 5, the top): the report (`sim.outputs.report`), the
scheduling-decision gate (`sim.outputs.gate`), notebook plumbing (`sim.outputs.notebooks`), the
pytest plugin (`sim.outputs.pytest_plugin`) and the command line (`sim.outputs.cli`)."""
