"""The schedulers the platform drives (layer 3 of `sim`): the reference model
(`sim.brokers.model`, no `mediator` import), the real Mediator (`sim.brokers.mediator`) and its
read-back from the database (`sim.brokers.readback`); `sim.brokers.entry.run` is the one way in."""
