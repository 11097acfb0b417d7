"""The ticket queue of seed 001: a folder of Markdown files whose names are their state.

A ticket is ``<hash>.md`` (queued), ``<hash>.wip.md`` (a worker's session holds it) or
``<hash>.done.md`` (finished). Claiming is ``os.link`` and an ``EEXIST`` means another worker
won, so many workers can share one folder with no lock server
(seed 001, "파일명이 곧 락인 이유"). This package is independent of the Mediator's
database: the only link between the two is that runs submitted for a ticket carry its hash as
``work_id`` (tickets.md, preamble).

Modules, from the pure core outwards:

* ``names`` – lanes from file-name suffixes (``TICKET_INPROGRESS`` / ``TICKET_DONE``).
* ``frontmatter`` – line-preserving edits of the frontmatter block.
* ``model`` – the frozen rows (``Ticket``, ``Answer``) and the frontmatter field table.
* ``rules`` – why an open ticket is or is not dispatched, and in what order (pure).
* ``view`` – what the board and ``tickets list`` show (pure).
* ``store`` – reading a folder into a snapshot; creating tickets and answers; unassign.
* ``claim`` – claim, heartbeat, finish and release of one ticket file.
* ``reclaim`` – the dead-session reclaimer.
* ``worker`` – ``tickets worker``: claim, run a command, record its outcome.
* ``races`` – multi-process claim races, used by the e2e tests and the throughput figure.
* ``board`` – the HTTP board and its static page.
* ``cli`` – the ``tickets`` command.
"""
