"""The simulated platform (layer 2 of `sim`): the event core that owns its loop
(`sim.platform.core`), the fleet's daemons (`sim.platform.fleet`), the one loop that drives a
broker (`sim.platform.driver`, with the `Broker` protocol) and what is measured
(`sim.platform.measure`: the one `Result` type). Imports neither broker nor `mediator`."""
