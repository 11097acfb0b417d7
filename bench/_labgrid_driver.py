"""bench_peers.py's hands on labgrid's coordinator: runs in labgrid's own venv (.bench/).

Reads one JSON command a line on stdin, answers ``{"value": ...}`` or ``{"error": ...}`` a line
on stdout. Commands: ``ready``, ``fill N``, ``reset``, ``rate CLIENTS COUNT``,
``submit_to_start``, ``release_to_next``. Usage: ``python _labgrid_driver.py HOST:PORT NODES``.

A run, in labgrid's terms: CreateReservation (filter ``pool=bench``) → wait until it is allocated
→ AcquirePlace of the allocated place (the start) … ReleasePlace + CancelReservation (the
release). Waiting reservations expire after 60 s unless polled (labgrid-client polls every
second while it waits), so the queued ones are polled every 20 s here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time

import grpc
from labgrid.remote.client import start_session
from labgrid.remote.generated import labgrid_coordinator_pb2 as pb

ALLOCATED, ACQUIRED = 1, 2


class Driver:
    def __init__(self, address: str, nodes: int) -> None:
        self.session = start_session(address)
        self.loop = self.session.loop
        self.stub = self.session.stub
        self.nodes = nodes
        self.queued: list[str] = []
        self.refresher: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        existing = {p.name for p in (await self.stub.GetPlaces(pb.GetPlacesRequest())).places}
        for i in range(self.nodes + 1):
            name = f"b{i}" if i < self.nodes else "busy"
            if name not in existing:
                await self.stub.AddPlace(pb.AddPlaceRequest(name=name))
            pool = "busy" if name == "busy" else "bench"
            await self.stub.SetPlaceTags(
                pb.SetPlaceTagsRequest(placename=name, tags={"pool": pool})
            )
        await self.stub.AcquirePlace(pb.AcquirePlaceRequest(placename="busy"))  # held all along
        self.refresher = self.loop.create_task(self._refresh())

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(20)
            for tok in list(self.queued):
                await self.stub.PollReservation(pb.PollReservationRequest(token=tok))

    async def _reserve(self, pool: str) -> pb.Reservation:
        req = pb.CreateReservationRequest(
            filters={"main": pb.Reservation.Filter(filter={"pool": pool})}, prio=0
        )
        return (await self.stub.CreateReservation(req)).reservation

    async def _allocated(self, res: pb.Reservation) -> str:
        while res.state != ALLOCATED:
            await asyncio.sleep(0.002)
            res = (
                await self.stub.PollReservation(pb.PollReservationRequest(token=res.token))
            ).reservation
        return str(res.allocations["main"])

    async def _release(self, place: str, token: str) -> None:
        await self.stub.ReleasePlace(pb.ReleasePlaceRequest(placename=place))
        await self.stub.CancelReservation(pb.CancelReservationRequest(token=token))

    async def fill(self, n: int) -> int:
        """Queue ``n`` more, for at most 45 s (the first would expire before the last came if
        filling took over 60 s): returns how many were queued."""
        deadline = time.monotonic() + 45
        for k in range(n):
            if time.monotonic() > deadline:
                return k
            self.queued.append((await self._reserve("busy")).token)
        return n

    async def reset(self) -> None:
        for tok in self.queued:
            # one that expired already (not polled within 60 s) is gone all the same
            with contextlib.suppress(grpc.aio.AioRpcError):
                await self.stub.CancelReservation(pb.CancelReservationRequest(token=tok))
        self.queued.clear()

    async def rate(self, clients: int, count: int) -> float:
        async def client(k: int) -> None:
            for _ in range(k):
                self.queued.append((await self._reserve("busy")).token)

        t0 = time.time()
        await asyncio.gather(*(client(count // clients) for _ in range(clients)))
        return (count // clients) * clients / (time.time() - t0)

    async def submit_to_start(self) -> float:
        t0 = time.time()
        res = await self._reserve("bench")
        place = await self._allocated(res)
        await self.stub.AcquirePlace(pb.AcquirePlaceRequest(placename=place))
        started = time.time()
        await self._release(place, res.token)
        return started - t0

    async def release_to_next(self) -> float:
        held = []
        for _ in range(self.nodes):
            res = await self._reserve("bench")
            place = await self._allocated(res)
            await self.stub.AcquirePlace(pb.AcquirePlaceRequest(placename=place))
            held.append((place, res.token))
        nxt = await self._reserve("bench")
        t0 = time.time()
        await self.stub.ReleasePlace(pb.ReleasePlaceRequest(placename=held[0][0]))
        await self.stub.CancelReservation(pb.CancelReservationRequest(token=held[0][1]))
        place = await self._allocated(nxt)
        await self.stub.AcquirePlace(pb.AcquirePlaceRequest(placename=place))
        started = time.time()
        for p, tok in [*held[1:], (place, nxt.token)]:
            await self._release(p, tok)
        return started - t0


def main() -> None:
    deadline = time.monotonic() + 60  # the coordinator takes a few seconds to listen
    while True:
        try:
            drv = Driver(sys.argv[1], int(sys.argv[2]))
            drv.loop.run_until_complete(drv.setup())
            break
        except Exception as exc:  # say why, then stop: the bench goes on without labgrid
            if time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            print(json.dumps({"error": f"labgrid coordinator not reachable: {exc!r}"}), flush=True)
            return
    for line in sys.stdin:
        cmd, *args = json.loads(line)
        try:
            if cmd == "ready":
                value = None
            else:
                value = drv.loop.run_until_complete(getattr(drv, cmd)(*args))
            print(json.dumps({"value": value}), flush=True)
        except Exception as exc:
            print(json.dumps({"error": f"{cmd}: {exc!r}"}), flush=True)


if __name__ == "__main__":
    main()
