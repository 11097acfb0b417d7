"""Run ``mediator`` on a chosen uvicorn HTTP stack, whatever the server's own choice:
``python bench/_stack.py h11-asyncio|httptools-uvloop ARGS...`` is ``mediator ARGS...``.

bench_submit.py ``--stacks`` compares the stacks in one run (docs/performance.md P1). The choice
reaches only this process: use it with ``--workers 1`` (spawned workers import the server anew).
"""

from __future__ import annotations

import runpy
import sys

import uvicorn.config as c

STACKS = {"h11-asyncio": ("h11", "asyncio"), "httptools-uvloop": ("httptools", "uvloop")}

if __name__ == "__main__":
    http, loop = STACKS[sys.argv.pop(1)]
    for key in c.HTTP_PROTOCOLS:
        if key != http:
            c.HTTP_PROTOCOLS[key] = c.HTTP_PROTOCOLS[http]
    for key in c.LOOP_FACTORIES:
        if key not in ("none", loop):
            c.LOOP_FACTORIES[key] = c.LOOP_FACTORIES[loop]
    sys.argv[0] = "mediator"
    runpy.run_module("mediator.cli.main", run_name="__main__", alter_sys=True)
