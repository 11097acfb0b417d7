"""The pure core: what the Mediator decides, with no I/O, no clock and no randomness.

``contract`` (is this a contract?), ``limits`` (the input limits and text checks every request
passes), ``capabilities`` (can this node serve this role?), ``match`` (which nodes a run gets),
``states`` (the run and step transition tables), ``progress`` (what a result does to its run),
``rows`` (the frozen rows the store returns) and ``errors``. Everything above this package calls
into it; it calls nothing above (docs/architecture.md, a boundary test).
"""
