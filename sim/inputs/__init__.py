"""What to simulate (layer 1 of `sim`, docs/architecture.md): the scenario schema and its text
forms, the built-in catalog (`sim.inputs.scenarios`), the pre-sampled workload every broker
consumes (`sim.inputs.workload`), trace readers (`sim.inputs.traces`) and what queueing theory
says about a scenario (`sim.inputs.theory`). Imports only the ground level (`sim.analysis`)."""
