-- The Mediator's schema: the single source of truth (docs/design.md §18).
-- No migrations before a first release; bump schema_version when this file changes.
-- Time: every statement uses mediator_now(at) (below), and no column default reads a clock, so
-- the simulator's virtual time reaches every timestamp (docs/design.md §13, the time-leak test).

CREATE TABLE schema_version (
    version integer PRIMARY KEY
);
INSERT INTO schema_version VALUES (10);

-- nullif matters: after a transaction-local setting ends, current_setting returns '', not NULL.
CREATE FUNCTION mediator_now() RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT coalesce(nullif(current_setting('mediator.now', true), '')::timestamptz, now()) $$;

-- The form every named query uses (issue 13): the clock's instant arrives as a parameter of the
-- statement itself, so virtual time costs no set_config round trip; NULL (no clock) falls back
-- to the setting, then to now().
CREATE FUNCTION mediator_now(at timestamptz) RETURNS timestamptz LANGUAGE sql STABLE AS
$$ SELECT coalesce(at, mediator_now()) $$;

CREATE TABLE nodes (
    node_id       text PRIMARY KEY,
    label         text NOT NULL DEFAULT '',
    -- '' for in-process callers and the development mode, never NULL (docs/design.md §14).
    principal     text NOT NULL DEFAULT '',
    capabilities  jsonb NOT NULL DEFAULT '{}',
    instance      text NOT NULL DEFAULT '',
    nonce         text NOT NULL DEFAULT '',   -- reserved, never selected (seed 003 §3.1)
    drain         text NOT NULL DEFAULT '' CHECK (drain IN ('', 'graceful', 'at-boundary')),
    seen_at       timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    -- Set by UpsertAdvert from the row as locked by the upsert, read back by its RETURNING:
    -- the previous values in one statement without a snapshot race (our departure from
    -- seed 003 §2.2, which would lose wake 6 under a concurrent drain change).
    prev_drain    text NOT NULL DEFAULT '',
    prev_instance text NOT NULL DEFAULT '',
    prev_live     boolean NOT NULL DEFAULT false,
    -- Whether the last advert's capabilities differed from the stored ones (wake 9), decided
    -- by the upsert from the row as locked, like the prev_* columns.
    caps_changed  boolean NOT NULL DEFAULT false,
    -- The expiry the last advert replaced, filled like prev_*: a `returned` row of
    -- fleet_history says when the node had gone (docs/design.md §18).
    prev_expires_at timestamptz,
    -- The actions the node's daemon offers (a JSON list of names, built-ins and plugins), so a
    -- submit can refuse a `uses` no node able to fill its role offers (docs/design.md §4
    -- "Actions"). NULL: the advert did not say (an older daemon, an in-process node): any.
    actions       jsonb
);

-- Identical needs by role share a class: the sweep matches each class once (P2).
CREATE TABLE needs_classes (
    needs_key text PRIMARY KEY,
    needs     jsonb NOT NULL
);

CREATE TABLE runs (
    run_id            text PRIMARY KEY,
    work_id           text NOT NULL DEFAULT '',
    state             text NOT NULL CHECK (state IN ('QUEUED', 'RUNNING', 'PASSED', 'FAILED')),
    verdict           text CHECK (verdict IN ('pass', 'fail', 'rejected', 'cancelled', 'lost', 'drained')),
    contract          jsonb NOT NULL,
    contract_versions jsonb NOT NULL DEFAULT '[]',
    needs_key         text NOT NULL REFERENCES needs_classes,
    assigned          jsonb,
    reject            jsonb,
    submitter         text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL,
    started_at        timestamptz,
    ended_at          timestamptz,
    sealed            boolean NOT NULL DEFAULT false,
    -- The optimistic guard (issue 13, docs/design.md §9): every statement that writes the run or
    -- its steps adds 1 (a locked transaction when it takes the run row), so a result decided from
    -- an unlocked read applies only if nothing changed since: its write matches no row otherwise.
    version           integer NOT NULL DEFAULT 0,
    -- The inserting transaction's full id: a sweep reads only the classes whose runs were queued
    -- since its last read (docs/design.md §6 "Sweeps remember"; runs enter QUEUED only when
    -- inserted). xid8 does not wrap, unlike a row's 32-bit xmin.
    queued_tx         xid8 NOT NULL DEFAULT pg_current_xact_id(),
    CHECK ((state IN ('PASSED', 'FAILED')) = (verdict IS NOT NULL))
);
-- The queue in FIFO order (R6: created_at, run_id breaks ties).
CREATE INDEX runs_queue ON runs (created_at, run_id) WHERE state = 'QUEUED';
-- The distinct needs classes waiting (a loose index scan in sweep_head).
CREATE INDEX runs_queue_class ON runs (needs_key, created_at, run_id) WHERE state = 'QUEUED';
-- The runs queued since a sweep's last read (sweep_head's delta).
CREATE INDEX runs_queue_tx ON runs (queued_tx) WHERE state = 'QUEUED';
-- A principal's QUEUED runs and classes: the caps of docs/security.md "Fair under floods".
CREATE INDEX runs_queue_submitter ON runs (submitter, needs_key) WHERE state = 'QUEUED';
CREATE INDEX runs_listing ON runs (created_at DESC, run_id DESC);
CREATE INDEX runs_work ON runs (work_id, created_at DESC) WHERE work_id <> '';
CREATE INDEX runs_unsealed ON runs (run_id) WHERE state IN ('PASSED', 'FAILED') AND NOT sealed;

CREATE TABLE steps (
    run_id     text NOT NULL REFERENCES runs ON DELETE CASCADE,
    seq        integer NOT NULL,
    name       text NOT NULL,
    kind       text NOT NULL CHECK (kind IN ('exec', 'ask')),
    role       text NOT NULL DEFAULT '',
    uses       text NOT NULL DEFAULT '',
    "with"     jsonb NOT NULL DEFAULT '{}',
    after      jsonb NOT NULL DEFAULT '[]',
    ask        text NOT NULL DEFAULT '',
    state      text NOT NULL CHECK (state IN ('PENDING', 'CLAIMED', 'ASKED', 'PASSED', 'FAILED', 'SKIPPED')),
    node_id    text NOT NULL DEFAULT '',      -- '' while unassigned (R4)
    instance   text NOT NULL DEFAULT '',      -- of the node that claimed it
    attempt    integer NOT NULL DEFAULT 0,
    chosen     jsonb,
    started_at timestamptz,
    ended_at   timestamptz,
    log        text NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, seq),
    UNIQUE (run_id, name)
);
CREATE INDEX steps_by_node ON steps (node_id, run_id) WHERE state IN ('PENDING', 'CLAIMED');

CREATE TABLE leases (
    node_id    text PRIMARY KEY,              -- I1: one run per node, by the schema
    run_id     text NOT NULL REFERENCES runs,
    instance   text NOT NULL DEFAULT '',      -- of the node when granted
    granted_at timestamptz NOT NULL,
    not_after  timestamptz NOT NULL
);
CREATE INDEX leases_run ON leases (run_id);
CREATE INDEX leases_expiry ON leases (not_after);

-- Time you can trust (docs/design.md §13): every stall of a Mediator process, forward jump of the
-- database's clock and database outage that was given back to adverts and leases, as an interval
-- of database time. A Mediator process that notices a gap gives back only what the gaps already
-- recorded over an overlapping interval did not, so a gap that several processes notice (the
-- workers of one `mediator serve`, the reaper) is given back once. Recent rows also let a submit
-- queue a run instead of refusing it while a node able to serve it expired inside a gap.
CREATE TABLE gaps (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind       text NOT NULL CHECK (kind IN ('stall', 'jump', 'outage')),
    began_at   timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL,
    seconds    float8 NOT NULL,                  -- what was given back
    noticed_at timestamptz NOT NULL
);
CREATE INDEX gaps_ended ON gaps (ended_at);

CREATE TABLE asks (
    ask_id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      text NOT NULL REFERENCES runs,
    seq         integer NOT NULL,
    question    text NOT NULL,
    raised_at   timestamptz NOT NULL,
    answer      text,
    ok          boolean,
    answered_by text,
    answered_at timestamptz,
    closed      boolean NOT NULL DEFAULT false,
    UNIQUE (run_id, seq)
);
CREATE INDEX asks_open ON asks (ask_id) WHERE NOT closed;

-- One row per transition, in the same transaction as the change: the ground truth for
-- analytics, the record's event log and /v1/events. The kinds are mediator.rows.EVENT_KINDS: a
-- queued submit is `submitted` with data.state = 'QUEUED' (there is no separate `queued`).
CREATE TABLE events (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    run_id  text NOT NULL DEFAULT '',
    node_id text NOT NULL DEFAULT '',
    kind    text NOT NULL CHECK (kind IN (
        'submitted', 'rejected', 'promoted', 'lease_granted', 'lease_released',
        'claimed', 'result', 'ask_raised', 'ask_answered', 'settled', 'cancelled')),
    data    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX events_run ON events (run_id, id);

-- The fleet's history (docs/design.md §18, the lab's twin): one row per change of a node that the
-- scheduler could see — never one per steady heartbeat. The advert upsert writes appeared,
-- restarted, drain_set, drain_lifted, capabilities_changed and returned in the same statement
-- (a data-modifying CTE that inserts only when something changed); the reaper's first statement
-- writes expired, `at` being the node's expires_at (the instant it went), once per expiry.
-- Every row's data carries the node's state after the change (instance, drain, capabilities,
-- label) and what it replaced, so a reader rebuilds the fleet at any instant from rows alone.
CREATE TABLE fleet_history (
    id      bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at      timestamptz NOT NULL,
    node_id text NOT NULL,
    kind    text NOT NULL CHECK (kind IN (
        'appeared', 'restarted', 'drain_set', 'drain_lifted', 'capabilities_changed',
        'returned', 'expired')),
    data    jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX fleet_history_at ON fleet_history (at, id);
-- One `expired` row per expiry, however many reapers notice it.
CREATE UNIQUE INDEX fleet_history_expired ON fleet_history (node_id, at) WHERE kind = 'expired';

-- PushAsks and /v1/events: NOTIFY is delivered on commit only, so a subscriber never hears of a
-- rolled-back change (R12), and every Mediator process listening hears every commit.
CREATE FUNCTION notify_events() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN PERFORM pg_notify('mediator_events', ''); RETURN NULL; END $$;
CREATE TRIGGER events_notify AFTER INSERT ON events
    FOR EACH STATEMENT EXECUTE FUNCTION notify_events();

-- /v1/events reads in (tx, id) order below the snapshot's xmin (queries.sql events_since): the
-- inserting transaction's full id, so an event that took a smaller id but committed later is
-- never skipped (issue 13 §6). xid8 does not wrap, unlike a row's 32-bit xmin.
ALTER TABLE events ADD COLUMN tx xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE INDEX events_tx ON events (tx, id);

-- run_counts counts the live runs from partial indexes: runs_queue (above) and this one.
CREATE INDEX runs_running ON runs (run_id) WHERE state = 'RUNNING';
