"""Studies built from many simulations (layer 4 of `sim`): capacity plans over fleet sizes
(`sim.studies.plan`) and per-capability-class plans (`sim.studies.classplan`)."""
