-- Named queries, loaded once into a dict by mediator/store/queries.py (procrastinate's pattern).
-- A block starts with a line `-- name --`; the comment lines that follow say why. A block
-- `-- fragment name --` is SQL several queries share, placed where they say {{name}}.
-- Every statement reads time through mediator_now(%(now)s) (docs/design.md §13): the store passes the
-- clock's instant with every statement (NULL without a clock: the server's now()), so virtual time
-- costs no statement of its own (issue 13). In scans over many rows it is written
-- (SELECT mediator_now(%(now)s)) so it is evaluated once (docs/architecture.md).

-- fragment capability_fits --
-- Whether node n's capabilities satisfy one key q(k, v) of a role's need (docs/design.md §4),
-- written once for every query that asks (fleet_for, sweep_head): a need `true` asks for the
-- key; any other value for an equal value, or a list holding it. jsonb equality keeps booleans
-- apart from numbers and compares numbers numerically, as the matcher does. The query names
-- the node `n` and the need's key and value `q(k, v)`.
coalesce(
    CASE WHEN q.v = 'true'::jsonb THEN n.capabilities ? q.k
         ELSE n.capabilities -> q.k = q.v
              OR (jsonb_typeof(n.capabilities -> q.k) = 'array'
                  AND n.capabilities -> q.k @> jsonb_build_array(q.v))
    END, false)

-- schema_version --
SELECT version FROM schema_version

-- observed_at --
-- Read before the rows (seed 003 §3.2): every expires_at in the answer is then > observed_at,
-- so a countdown computed from it is never negative.
SELECT mediator_now(%(now)s) AS observed_at

-- fleet_for --
-- The fleet as submit needs it: only live nodes that might serve some role of this contract.
-- A superset of the matcher's candidates (a need `true` only asks for the key here; the matcher
-- re-checks truthiness), so the answer is the matcher's own, but a submit no longer reads and
-- decodes every node of a large fleet. JSON types are kept: jsonb equality keeps booleans apart
-- from numbers and compares numbers numerically, as the matcher does (docs/design.md §4).
-- With the submit's run_id it also says whether that run exists (R3: the submit then answers
-- the existing run), so a submit reads once (issue 13): always one row at least, its node
-- columns NULL when no live node might serve.
-- With the submitter it also counts that principal's QUEUED runs and distinct needs classes, and
-- says whether this contract's class is among them: the per-principal caps (docs/security.md
-- "Fair under floods") ride on the same read, one index range of runs_queue_submitter.
SELECT e.existing, n.node_id, n.capabilities, n.instance, n.drain, n.busy,
       e.queued, e.classes, e.has_class, n.actions
FROM (SELECT EXISTS (SELECT 1 FROM runs WHERE run_id = %(run_id)s) AS existing,
             q.queued, q.classes, q.has_class
      FROM (SELECT count(*) AS queued, count(DISTINCT needs_key) AS classes,
                   coalesce(bool_or(needs_key = %(key)s), false) AS has_class
            FROM runs
            WHERE state = 'QUEUED' AND submitter = %(submitter)s
              AND %(submitter)s::text IS NOT NULL) q) e
LEFT JOIN LATERAL (
    SELECT n.node_id, n.capabilities, n.instance, n.drain, (l.node_id IS NOT NULL) AS busy,
           n.actions
    FROM nodes n
    LEFT JOIN leases l ON l.node_id = n.node_id
    WHERE n.expires_at > mediator_now(%(now)s)
      AND EXISTS (
          SELECT 1 FROM jsonb_each(%(roles)s::jsonb) AS r(role, need)
          WHERE NOT EXISTS (
              SELECT 1 FROM jsonb_each(r.need) AS q(k, v)
              WHERE NOT {{capability_fits}}))
) n ON true
ORDER BY n.node_id

-- live_adverts --
SELECT node_id, capabilities, instance, drain
FROM nodes
WHERE expires_at > mediator_now(%(now)s)
ORDER BY node_id

-- busy_nodes --
SELECT node_id FROM leases ORDER BY node_id

-- draining_nodes --
-- Expired nodes are left out: the candidates come from live adverts, so the two lists use one
-- criterion and cannot drift apart (seed 003 §5).
SELECT node_id FROM nodes WHERE drain <> '' AND expires_at > mediator_now(%(now)s) ORDER BY node_id

-- unavailable_nodes --
-- busy ∪ draining (FR-11 central side); match() knows nothing of drain.
SELECT node_id FROM leases
UNION
SELECT node_id FROM nodes WHERE drain <> '' AND expires_at > mediator_now(%(now)s)
ORDER BY node_id

-- upsert_advert --
-- One statement (seed 003 §2.2) that returns the previous drain policy, instance and liveness
-- from the row as locked by the upsert (our departure: a CTE snapshot can miss a concurrent
-- drain change and lose wake 6). caps_changed is jsonb equality (key order and 1 vs 1.0 do
-- not count as a change): wake 9. The WHERE binds a node to its first principal (§9): no row
-- back means another principal owns this node_id.
-- With the node's lease renewal in the same statement (issue 13: a heartbeat is one statement,
-- and R14: a steady one never sweeps): the leases of this instance get lease_ttl more, only if
-- the upsert wrote (the node is ours) and lease_ttl is given. A data-modifying CTE runs whether
-- or not it is read; the node row is locked before any lease row, the locking order of docs/design.md §9.
-- And the fleet's history (docs/design.md §18): a row per change the advert made, decided from
-- the same locked row; a steady heartbeat matches no kind and inserts nothing.
WITH up AS (
    INSERT INTO nodes AS n (node_id, label, principal, capabilities, instance, drain, seen_at,
                            expires_at, prev_drain, prev_instance, prev_live, actions)
    VALUES (%(node_id)s, %(label)s, %(principal)s, %(capabilities)s, %(instance)s, %(drain)s,
            mediator_now(%(now)s), mediator_now(%(now)s) + make_interval(secs => %(ttl)s),
            '', '', false, %(actions)s)
    ON CONFLICT (node_id) DO UPDATE SET
        prev_drain    = n.drain,
        prev_instance = n.instance,
        prev_live     = n.expires_at > mediator_now(%(now)s),
        prev_expires_at = n.expires_at,
        caps_changed  = n.capabilities IS DISTINCT FROM EXCLUDED.capabilities,
        label         = EXCLUDED.label,
        capabilities  = EXCLUDED.capabilities,
        instance      = EXCLUDED.instance,
        drain         = EXCLUDED.drain,
        actions       = EXCLUDED.actions,
        seen_at       = EXCLUDED.seen_at,
        expires_at    = EXCLUDED.expires_at
    WHERE n.principal = EXCLUDED.principal
    RETURNING n.prev_drain, n.prev_instance, n.prev_live, (n.xmax = 0) AS inserted, n.expires_at,
              n.caps_changed, n.node_id, n.label, n.instance, n.drain, n.capabilities,
              n.prev_expires_at, n.seen_at
), renewed AS (
    UPDATE leases
    SET not_after = mediator_now(%(now)s) + make_interval(secs => %(lease_ttl)s::float8)
    WHERE node_id = %(node_id)s AND instance = %(instance)s
      AND %(lease_ttl)s::float8 IS NOT NULL AND EXISTS (SELECT 1 FROM up)
    RETURNING run_id
), history AS (
    INSERT INTO fleet_history (at, node_id, kind, data)
    SELECT up.seen_at, up.node_id, k.kind,
           jsonb_build_object('instance', up.instance, 'drain', up.drain,
                              'capabilities', up.capabilities, 'label', up.label) || k.prev
    FROM up CROSS JOIN LATERAL (VALUES
        (1, 'appeared', up.inserted, '{}'::jsonb),
        (2, 'returned', NOT up.inserted AND NOT up.prev_live,
            jsonb_build_object('gone_at', up.prev_expires_at)),
        (3, 'restarted', NOT up.inserted AND up.prev_instance <> up.instance,
            jsonb_build_object('prev_instance', up.prev_instance)),
        (4, 'drain_set', NOT up.inserted AND up.drain <> '' AND up.drain <> up.prev_drain,
            jsonb_build_object('prev_drain', up.prev_drain)),
        (5, 'drain_lifted', NOT up.inserted AND up.drain = '' AND up.prev_drain <> '',
            jsonb_build_object('prev_drain', up.prev_drain)),
        (6, 'capabilities_changed', NOT up.inserted AND up.caps_changed, '{}'::jsonb)
    ) AS k(ord, kind, happened, prev)
    WHERE k.happened
    ORDER BY k.ord
)
SELECT prev_drain, prev_instance, prev_live, inserted, expires_at, caps_changed FROM up

-- list_nodes --
-- seed 003 §3.1: LEFT JOIN on the lease primary key cannot multiply rows; principal and nonce
-- are not selected, which is how they stay out. Paged by node_id (keyset: after the last id of
-- the previous page; LIMIT NULL is every row), so a node live across the pages is listed once.
SELECT n.node_id, n.label, n.instance, n.capabilities, n.seen_at, n.expires_at, n.drain,
       n.actions, l.run_id AS lease_run_id, l.not_after AS lease_not_after
FROM nodes n
LEFT JOIN leases l ON l.node_id = n.node_id
WHERE n.expires_at > mediator_now(%(now)s) AND n.node_id > %(after)s
ORDER BY n.node_id
LIMIT %(limit)s

-- list_runs --
-- seed 003 §4: current[] by a correlated subquery so LIMIT counts runs, not steps; ties broken
-- by run_id so the order is the same on every call.
SELECT r.run_id, r.state, r.verdict, r.work_id, r.created_at, r.started_at, r.ended_at,
       r.assigned, r.reject,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'node', s.node_id, 'step', s.name, 'attempt', s.attempt,
                        'started_at', s.started_at) ORDER BY s.seq)
                 FROM steps s
                 WHERE s.run_id = r.run_id AND s.state = 'CLAIMED'), '[]'::jsonb) AS current
FROM runs r
WHERE (%(state)s::text IS NULL OR r.state = %(state)s::text)
  AND (%(work_id)s::text IS NULL OR r.work_id = %(work_id)s::text)
  AND (%(since)s::timestamptz IS NULL OR r.created_at > %(since)s::timestamptz)
ORDER BY r.created_at DESC, r.run_id DESC
LIMIT %(limit)s

-- list_queued --
-- seed 003 §6: FIFO by (created_at, run_id). Returns needs_key instead of the contract
-- (our departure: a sweep over 10,000 queued runs must not parse 10,000 contracts, P2).
SELECT run_id, needs_key, created_at
FROM runs
WHERE state = 'QUEUED'
ORDER BY created_at, run_id

-- live_contract --
-- The liveContract rule of seed 003 §6.
SELECT coalesce(contract_versions -> -1, contract) AS contract FROM runs WHERE run_id = %(run_id)s

-- queued_page --
-- The queue in FIFO order restricted to classes that may move, one page at a time (keyset
-- pagination), so a sweep that stops early reads only the head.
SELECT run_id, needs_key, created_at
FROM runs
WHERE state = 'QUEUED'
  AND needs_key = ANY(%(keys)s)
  AND (created_at, run_id) > (%(after_at)s::timestamptz, %(after_id)s::text)
ORDER BY created_at, run_id
LIMIT %(limit)s

-- queue_position --
SELECT count(*) + 1 AS position
FROM runs q, runs r
WHERE r.run_id = %(run_id)s AND q.state = 'QUEUED'
  AND (q.created_at, q.run_id) < (r.created_at, r.run_id)

-- create_run --
-- A submit's whole write in one statement (issue 13; R5: steps exist from submit; R12's order;
-- I1): the needs class, the run, its steps (for a 201 already carrying node_id and runAcquires'
-- `chosen`), its leases in node_id order (docs/design.md §9), its events in order. A duplicate
-- run_id is no row and nothing else is written (R3); a lease conflict fails the whole statement
-- (NodeTaken: R2). Returns one row per step, the run's columns on each. The states are
-- %(run_to)s and %(step_to)s, edges from no row that the store checks against mediator.states.
WITH cls AS (
    INSERT INTO needs_classes (needs_key, needs) VALUES (%(needs_key)s, %(needs)s)
    ON CONFLICT (needs_key) DO NOTHING
), run AS (
    INSERT INTO runs (run_id, work_id, state, verdict, contract, needs_key, assigned, reject,
                      submitter, created_at, started_at, ended_at)
    VALUES (%(run_id)s, %(work_id)s, %(run_to)s, %(verdict)s, %(contract)s, %(needs_key)s,
            %(assigned)s, %(reject)s, %(submitter)s, mediator_now(%(now)s),
            CASE WHEN %(started)s::boolean THEN mediator_now(%(now)s) END,
            CASE WHEN %(ended)s::boolean THEN mediator_now(%(now)s) END)
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id, work_id, state, verdict, assigned, reject, submitter, created_at,
              started_at, ended_at, sealed
), st AS (
    INSERT INTO steps (run_id, seq, name, kind, role, uses, "with", after, ask, state, node_id,
                       chosen)
    SELECT r.run_id, x.seq, x.name, x.kind, x.role, x.uses, x."with", x.after, x.ask,
           %(step_to)s::text, x.node_id, x.chosen
    FROM run r,
         jsonb_to_recordset(%(steps)s) AS x(seq integer, name text, kind text, role text,
                                            uses text, "with" jsonb, after jsonb, ask text,
                                            node_id text, chosen jsonb)
    ORDER BY x.seq
    RETURNING run_id, seq, name, kind, role, uses, "with", after, ask, state, node_id, instance,
              attempt, chosen, started_at, ended_at
), ls AS (
    INSERT INTO leases (node_id, run_id, instance, granted_at, not_after)
    SELECT x.node_id, r.run_id, x.instance, mediator_now(%(now)s),
           mediator_now(%(now)s) + make_interval(secs => %(ttl)s::float8)
    FROM run r, jsonb_to_recordset(%(leases)s) AS x(node_id text, instance text)
    ORDER BY x.node_id
), ev AS (
    INSERT INTO events (at, run_id, node_id, kind, data)
    SELECT mediator_now(%(now)s), r.run_id, x.node_id, x.kind, x.data
    FROM run r,
         ROWS FROM (jsonb_to_recordset(%(events)s) AS (node_id text, kind text, data jsonb))
         WITH ORDINALITY AS x(node_id, kind, data, ord)
    ORDER BY x.ord
)
SELECT r.run_id, r.work_id, r.state, r.verdict, r.assigned, r.reject, r.submitter,
       r.created_at, r.started_at, r.ended_at, r.sealed,
       s.seq AS s_seq, s.name AS s_name, s.kind AS s_kind, s.role AS s_role, s.uses AS s_uses,
       s."with" AS s_with_, s.after AS s_after, s.ask AS s_ask, s.state AS s_state,
       s.node_id AS s_node_id, s.instance AS s_instance, s.attempt AS s_attempt,
       s.chosen AS s_chosen, s.started_at AS s_started_at, s.ended_at AS s_ended_at
FROM run r LEFT JOIN st s ON true
ORDER BY s.seq

-- raise_asks --
-- raiseAsks (docs/design.md §11): one ask per ask step whose `after` steps all PASSED, step →
-- ASKED, one event each. Callers run it only for RUNNING runs (R4).
WITH due AS (
    SELECT s.run_id, s.seq, s.ask
    FROM steps s
    WHERE s.run_id = %(run_id)s AND s.kind = 'ask' AND s.state = 'PENDING'
      AND NOT EXISTS (
          SELECT 1 FROM steps d
          WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
            AND d.name IN (SELECT jsonb_array_elements_text(s.after)))
    ORDER BY s.seq
    FOR UPDATE OF s
), asked AS (
    UPDATE steps s SET state = 'ASKED', started_at = mediator_now(%(now)s)
    FROM due WHERE s.run_id = due.run_id AND s.seq = due.seq AND s.state = 'PENDING'
    RETURNING s.seq
), ins AS (
    INSERT INTO asks (run_id, seq, question, raised_at)
    SELECT run_id, seq, ask, mediator_now(%(now)s) FROM due ORDER BY seq
    RETURNING ask_id, run_id, seq, question, raised_at
), ev AS (
    INSERT INTO events (at, run_id, kind, data)
    SELECT mediator_now(%(now)s), run_id, 'ask_raised', jsonb_build_object('ask_id', ask_id, 'seq', seq)
    FROM ins
)
SELECT ask_id, run_id, seq, question, raised_at FROM ins ORDER BY seq

-- insert_events --
INSERT INTO events (at, run_id, node_id, kind, data)
SELECT mediator_now(%(now)s), x.run_id, x.node_id, x.kind, x.data
FROM ROWS FROM (jsonb_to_recordset(%(events)s)
                AS (run_id text, node_id text, kind text, data jsonb)) WITH ORDINALITY
     AS x(run_id, node_id, kind, data, ord)
ORDER BY x.ord

-- get_run --
SELECT run_id, work_id, state, verdict, assigned, reject, submitter, created_at, started_at,
       ended_at, sealed
FROM runs WHERE run_id = %(run_id)s

-- lock_run --
-- The locking rule (docs/design.md §9): a transaction that changes a run locks its row first —
-- by adding 1 to its version, so a result decided from an unlocked read before this transaction
-- (issue 13) finds its guard failed and decides again from what this one leaves.
UPDATE runs SET version = version + 1 WHERE run_id = %(run_id)s
RETURNING run_id, work_id, state, verdict, assigned, reject, submitter, created_at, started_at,
          ended_at, sealed

-- run_steps --
-- Steps carry chosen (seed 003 §7; FR-3).
SELECT run_id, seq, name, kind, role, uses, "with" AS with_, after, ask, state, node_id, instance,
       attempt, chosen, started_at, ended_at
FROM steps WHERE run_id = %(run_id)s ORDER BY seq

-- mark_sealed --
-- And whether any run is QUEUED, read after the terminal commit (this statement follows the seal,
-- which follows the commit): a result that settled skips its wake's sweep when nothing waits
-- (issue 13) without a statement of its own. A submit that queues a run after this read runs its
-- own R17 sweep after its commit, and sees this release.
WITH m AS (
    UPDATE runs SET sealed = true WHERE run_id = %(run_id)s AND state IN ('PASSED', 'FAILED')
)
SELECT EXISTS (SELECT 1 FROM runs q WHERE q.state = 'QUEUED') AS queued

-- unsealed_runs --
-- Terminal runs whose record was not sealed (a crash between commit and seal): startup and every
-- reaper pass seal them (docs/design.md §12).
SELECT run_id FROM runs WHERE state IN ('PASSED', 'FAILED') AND NOT sealed
ORDER BY run_id LIMIT %(limit)s

-- work --
-- Claimable steps of a node (docs/design.md §9): PENDING, on this node, of a RUNNING run, every
-- `after` step PASSED. Oldest run first.
SELECT s.run_id, s.seq, s.name, s.kind, s.role, s.uses, s."with" AS with_, s.after, s.ask,
       s.state, s.node_id, s.instance, s.attempt, s.chosen, s.started_at, s.ended_at
FROM steps s
JOIN runs r ON r.run_id = s.run_id
WHERE s.node_id = %(node_id)s AND s.state = 'PENDING' AND r.state = 'RUNNING'
  AND NOT EXISTS (
      SELECT 1 FROM steps d
      WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
        AND d.name IN (SELECT jsonb_array_elements_text(s.after)))
ORDER BY r.started_at, s.run_id, s.seq

-- nodes_with_work --
-- Which of these nodes have a claimable step now (the `work` statement's condition, for many
-- nodes at once): a held long poll is answered when its node is among them (docs/design.md §19
-- "The wake of a waiting node"). One statement per change, however many polls are held.
SELECT DISTINCT s.node_id
FROM steps s
JOIN runs r ON r.run_id = s.run_id
WHERE s.node_id = ANY(%(node_ids)s::text[]) AND s.state = 'PENDING' AND r.state = 'RUNNING'
  AND NOT EXISTS (
      SELECT 1 FROM steps d
      WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
        AND d.name IN (SELECT jsonb_array_elements_text(s.after)))

-- lock_steps --
-- Second in the lock order (run row, then steps, leases, asks).
SELECT run_id, seq, name, kind, role, uses, "with" AS with_, after, ask, state, node_id, instance,
       attempt, chosen, started_at, ended_at
FROM steps WHERE run_id = %(run_id)s ORDER BY seq FOR UPDATE

-- lock_run_steps --
-- The locking rule in one statement (issue 13): the run row first, its version bumped as
-- lock_run does (the steps CTE reads its run_id, so it runs after the run is locked), then its
-- steps in seq order. One row per step, the run's columns on each; no row: no such run.
WITH r AS (
    UPDATE runs SET version = version + 1 WHERE run_id = %(run_id)s
    RETURNING run_id, work_id, state, verdict, assigned, reject, submitter, created_at,
              started_at, ended_at, sealed
), s AS (
    SELECT run_id, seq, name, kind, role, uses, "with", after, ask, state, node_id, instance,
           attempt, chosen, started_at, ended_at
    FROM steps WHERE run_id = (SELECT run_id FROM r) ORDER BY seq FOR UPDATE
)
SELECT r.run_id, r.work_id, r.state, r.verdict, r.assigned, r.reject, r.submitter,
       r.created_at, r.started_at, r.ended_at, r.sealed,
       s.seq AS s_seq, s.name AS s_name, s.kind AS s_kind, s.role AS s_role, s.uses AS s_uses,
       s."with" AS s_with_, s.after AS s_after, s.ask AS s_ask, s.state AS s_state,
       s.node_id AS s_node_id, s.instance AS s_instance, s.attempt AS s_attempt,
       s.chosen AS s_chosen, s.started_at AS s_started_at, s.ended_at AS s_ended_at
FROM r LEFT JOIN s ON true
ORDER BY s.seq

-- claim_step --
-- A claim in one statement (issue 13): PENDING → CLAIMED, and its event, only if every condition
-- of docs/design.md §9 holds — the run RUNNING, the step this node's exec step, the daemon
-- instance current (when the caller names one), the node not draining at the step boundary,
-- every `after` step PASSED. The run row is taken first, its version bumped (the locking order
-- of docs/design.md §9: a cancel or reaper holds it, so they serialise with the claim, and a
-- result read before the claim decides again, issue 13); the step row is locked by the UPDATE
-- itself. No row back: claim_refusal says why, read only then.
-- The rows are result_source's, as the claim leaves the run (the claimed step from its UPDATE,
-- the others as read, the run's new version, and `size`, its contract's length — the snapshot's
-- weight): the result that follows may decide from them instead of reading again, its write
-- guarded by that version like any result (issue 13).
WITH run AS (
    UPDATE runs SET version = version + 1
    WHERE run_id = %(run_id)s AND state = 'RUNNING'
    RETURNING run_id, work_id, state, verdict, assigned, reject, submitter, created_at,
              started_at, ended_at, sealed, version, octet_length(contract::text) AS size
), node AS (
    SELECT coalesce((SELECT instance FROM nodes WHERE node_id = %(node_id)s), '') AS instance,
           coalesce((SELECT drain FROM nodes WHERE node_id = %(node_id)s), '') AS drain
), claimed AS (
    UPDATE steps s
    SET state = 'CLAIMED', attempt = s.attempt + 1, instance = (SELECT instance FROM node),
        started_at = mediator_now(%(now)s), ended_at = NULL
    WHERE s.run_id = %(run_id)s AND s.seq = %(seq)s AND s.state = 'PENDING' AND s.kind = 'exec'
      AND s.node_id = %(node_id)s
      AND EXISTS (SELECT 1 FROM run)
      AND (%(instance)s::text IS NULL OR %(instance)s::text = (SELECT instance FROM node))
      AND (SELECT drain FROM node) <> 'at-boundary'
      AND NOT EXISTS (
          SELECT 1 FROM steps d
          WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
            AND d.name IN (SELECT jsonb_array_elements_text(s.after)))
    RETURNING s.seq, s.name, s.kind, s.role, s.uses, s."with", s.after, s.ask, s.state,
              s.node_id, s.instance, s.attempt, s.chosen, s.started_at, s.ended_at
), ev AS (
    INSERT INTO events (at, run_id, node_id, kind, data)
    SELECT mediator_now(%(now)s), %(run_id)s, %(node_id)s, 'claimed',
           jsonb_build_object('seq', seq, 'attempt', attempt)
    FROM claimed
), src AS (
    SELECT * FROM claimed
    UNION ALL
    SELECT s.seq, s.name, s.kind, s.role, s.uses, s."with", s.after, s.ask, s.state,
           s.node_id, s.instance, s.attempt, s.chosen, s.started_at, s.ended_at
    FROM steps s, claimed c WHERE s.run_id = %(run_id)s AND s.seq <> c.seq
)
SELECT r.run_id, r.work_id, r.state, r.verdict, r.assigned, r.reject, r.submitter, r.created_at,
       r.started_at, r.ended_at, r.sealed, r.version, r.size,
       x.seq AS s_seq, x.name AS s_name, x.kind AS s_kind, x.role AS s_role, x.uses AS s_uses,
       x."with" AS s_with_, x.after AS s_after, x.ask AS s_ask, x.state AS s_state,
       x.node_id AS s_node_id, x.instance AS s_instance, x.attempt AS s_attempt,
       x.chosen AS s_chosen, x.started_at AS s_started_at, x.ended_at AS s_ended_at,
       n.node_id AS n_node_id, n.instance AS n_instance, n.drain AS n_drain,
       n.expires_at > mediator_now(%(now)s) AS n_live,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'node_id', l.node_id, 'instance', l.instance,
                        'drain', coalesce(ln.drain, '')) ORDER BY l.node_id)
                 FROM leases l LEFT JOIN nodes ln ON ln.node_id = l.node_id
                 WHERE l.run_id = %(run_id)s), '[]'::jsonb) AS leases
FROM run r CROSS JOIN src x
LEFT JOIN nodes n ON n.node_id = %(node_id)s
ORDER BY x.seq

-- claim_refusal --
-- Why a claim matched nothing (read only then): the run, the step, the node and whether every
-- `after` step PASSED, for the error code (docs/design.md §9). No row: no such run.
SELECT r.state AS run_state, s.seq AS step_seq, s.node_id AS step_node, s.state AS step_state,
       s.kind AS step_kind, coalesce(n.instance, '') AS node_instance,
       coalesce(n.drain, '') AS node_drain,
       NOT EXISTS (
           SELECT 1 FROM steps d
           WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
             AND d.name IN (SELECT jsonb_array_elements_text(s.after))) AS after_passed
FROM runs r
LEFT JOIN steps s ON s.run_id = r.run_id AND s.seq = %(seq)s
LEFT JOIN nodes n ON n.node_id = %(node_id)s
WHERE r.run_id = %(run_id)s

-- finish_step --
-- %(step_to)s only from the states mediator.states allows it from (%(step_from)s, issue 13).
UPDATE steps SET state = %(step_to)s, ended_at = mediator_now(%(now)s), log = log || %(log)s
WHERE run_id = %(run_id)s AND seq = %(seq)s AND state = ANY(%(step_from)s)

-- skip_steps --
UPDATE steps SET state = 'SKIPPED', ended_at = mediator_now(%(now)s)
WHERE run_id = %(run_id)s AND seq = ANY(%(seqs)s) AND state IN ('PENDING', 'CLAIMED', 'ASKED')

-- run_leases --
-- With each node's drain policy: the at-boundary check needs it, and it saves a read per node.
SELECT l.node_id, l.instance, coalesce(n.drain, '') AS drain
FROM leases l LEFT JOIN nodes n ON n.node_id = l.node_id
WHERE l.run_id = %(run_id)s ORDER BY l.node_id
FOR UPDATE OF l

-- delete_leases --
DELETE FROM leases WHERE run_id = %(run_id)s AND node_id = ANY(%(nodes)s)
RETURNING node_id

-- end_run --
-- %(run_to)s only from the states mediator.states allows it from (%(run_from)s, issue 13).
UPDATE runs SET state = %(run_to)s, verdict = %(verdict)s, ended_at = mediator_now(%(now)s)
WHERE run_id = %(run_id)s AND state = ANY(%(run_from)s)
RETURNING run_id

-- close_asks --
UPDATE asks SET closed = true WHERE run_id = %(run_id)s AND NOT closed

-- expired_lease_runs --
-- With the fleet's history (docs/design.md §18): an `expired` row for each node whose advert
-- lapsed, at its expires_at, written once per expiry (the partial unique index decides between
-- reapers); a node that returned before a pass noticed has its `returned` row say when it went.
WITH gone AS (
    INSERT INTO fleet_history (at, node_id, kind, data)
    SELECT n.expires_at, n.node_id, 'expired',
           jsonb_build_object('instance', n.instance, 'drain', n.drain,
                              'capabilities', n.capabilities, 'label', n.label,
                              'noticed_at', mediator_now(%(now)s))
    FROM nodes n
    WHERE n.expires_at <= mediator_now(%(now)s)
      AND NOT EXISTS (SELECT 1 FROM fleet_history h
                      WHERE h.kind = 'expired' AND h.node_id = n.node_id AND h.at = n.expires_at)
    ORDER BY n.expires_at, n.node_id
    ON CONFLICT DO NOTHING
)
SELECT DISTINCT run_id FROM leases WHERE not_after <= (SELECT mediator_now(%(now)s)) ORDER BY run_id

-- delete_expired_leases --
-- Re-checked under the run lock: an advert that renewed the lease meanwhile keeps it.
DELETE FROM leases WHERE run_id = %(run_id)s AND not_after <= mediator_now(%(now)s)
RETURNING node_id

-- node_leases --
SELECT run_id, instance FROM leases WHERE node_id = %(node_id)s

-- rebind_lease --
-- Restart detection with nothing run yet under the old instance: the lease follows the node's
-- new daemon (our departure: such a run has lost nothing).
UPDATE leases SET instance = %(instance)s, not_after = mediator_now(%(now)s) + make_interval(secs => %(ttl)s)
WHERE node_id = %(node_id)s AND run_id = %(run_id)s

-- rebind_chosen --
UPDATE steps SET chosen = jsonb_set(chosen, '{instance}', to_jsonb(%(instance)s::text))
WHERE run_id = %(run_id)s AND node_id = %(node_id)s AND chosen IS NOT NULL

-- open_asks --
SELECT ask_id, run_id, seq, question, raised_at FROM asks WHERE NOT closed ORDER BY ask_id

-- get_ask --
SELECT ask_id, run_id, seq, closed FROM asks WHERE ask_id = %(ask_id)s

-- lock_ask --
SELECT ask_id, run_id, seq, closed FROM asks WHERE ask_id = %(ask_id)s FOR UPDATE

-- answer_ask --
UPDATE asks SET answer = %(answer)s, ok = %(ok)s, answered_by = %(by)s,
                answered_at = mediator_now(%(now)s), closed = true
WHERE ask_id = %(ask_id)s AND NOT closed

-- events_since --
-- /v1/events: rows in (tx, id) order after the stream's place, only from transactions older than
-- this snapshot's xmin. Every such transaction has ended, so no row can still appear before the
-- place a stream has reached; ordering by id alone skipped a smaller id that committed later
-- (issue 13 §6, docs/design.md §19 route 14). The order is xid8's, a number: the column is
-- named `e.tx` in ORDER BY because a bare `tx` there means the output column, the text the place
-- is sent in, and text puts 10000 before 9999 (issue 24: pages out of order, events skipped).
SELECT e.id, e.at, e.run_id, e.node_id, e.kind, e.data, e.tx::text AS place_tx
FROM events AS e
WHERE (e.tx, e.id) > (%(tx)s::text::xid8, %(after)s::bigint)
  AND e.tx < pg_snapshot_xmin(pg_current_snapshot())
ORDER BY e.tx, e.id
LIMIT %(limit)s

-- last_event_id --
SELECT coalesce(max(id), 0) AS id FROM events

-- node_principal --
-- Only for the authorization check; never part of a listing (docs/design.md §14).
SELECT principal FROM nodes WHERE node_id = %(node_id)s

-- run_counts --
-- The live runs lab-wide: GET /v1/runs' header, which the panel polls every 5 s. Only the two
-- live states, each counted from its partial index (runs_queue, runs_running), so the cost
-- follows what is queued and running, not the history (issue 13; GROUP BY state read every run).
SELECT 'QUEUED' AS state, count(*) AS n FROM runs WHERE state = 'QUEUED'
UNION ALL
SELECT 'RUNNING', count(*) FROM runs WHERE state = 'RUNNING'

-- wait_histogram --
-- Cumulative buckets of queue wait (started_at - created_at) over every run that started.
SELECT b.le, count(r.run_id) AS n
FROM unnest(%(bounds)s::float8[]) AS b(le)
LEFT JOIN runs r ON r.started_at IS NOT NULL
               AND extract(epoch FROM r.started_at - r.created_at) <= b.le
GROUP BY b.le ORDER BY b.le

-- wait_sum --
SELECT count(*) AS n, coalesce(sum(extract(epoch FROM started_at - created_at)), 0) AS total
FROM runs WHERE started_at IS NOT NULL

-- ping --
SELECT 1 AS ok

-- seal_source --
-- Everything a record's seal is generated from, in one read (docs/design.md §12). A result that
-- settles its run gets the same from apply_result instead (issue 13).
SELECT r.state, r.verdict, r.ended_at, r.contract,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'id', e.id, 'at', e.at, 'run_id', e.run_id, 'node_id', e.node_id,
                        'kind', e.kind, 'data', e.data) ORDER BY e.id)
                 FROM events e WHERE e.run_id = r.run_id), '[]'::jsonb) AS events,
       coalesce((SELECT jsonb_agg(jsonb_build_array(s.seq, s.name, s.log) ORDER BY s.seq)
                 FROM steps s WHERE s.run_id = r.run_id), '[]'::jsonb) AS logs
FROM runs r WHERE r.run_id = %(run_id)s

-- unsealed_count --
-- Terminal runs whose record is not sealed yet (/healthz, /metrics): record work that failed
-- after its commit and waits for the next reaper pass (issue 11 §5). Uses runs_unsealed.
SELECT count(*) AS n FROM runs WHERE state IN ('PASSED', 'FAILED') AND NOT sealed

-- active_runs --
-- Runs not yet terminal, for the startup check that every record was opened (issue 11 §5).
SELECT run_id FROM runs WHERE state IN ('QUEUED', 'RUNNING') ORDER BY run_id

-- queued_details --
-- GET /v1/runs (issue 15 §4): the queue position and the needs of every QUEUED run on a page, in
-- one statement for the whole page instead of queue_position + live_contract per row. Positions
-- come from one ordered pass over runs_queue (1 + the QUEUED runs with a smaller
-- (created_at, run_id)); the needs from the run's class, as the sweep reads them (P2).
WITH q AS (
    SELECT run_id, needs_key, row_number() OVER (ORDER BY created_at, run_id) AS position
    FROM runs
    WHERE state = 'QUEUED'
)
SELECT q.run_id, q.position, c.needs
FROM q
JOIN needs_classes c ON c.needs_key = q.needs_key
WHERE q.run_id = ANY(%(run_ids)s)

-- result_source --
-- What a result decides from (issue 13), in one statement and without locks: the run with its
-- version (the guard apply_result checks), its steps in seq order, the reporting node's row
-- (n_*; NULL: no such node) and the run's leases with each leased node's drain policy (the
-- at-boundary check). One row per step, the run's and node's columns and the leases on each;
-- no row: no such run.
SELECT r.run_id, r.work_id, r.state, r.verdict, r.assigned, r.reject, r.submitter, r.created_at,
       r.started_at, r.ended_at, r.sealed, r.version,
       s.seq AS s_seq, s.name AS s_name, s.kind AS s_kind, s.role AS s_role, s.uses AS s_uses,
       s."with" AS s_with_, s.after AS s_after, s.ask AS s_ask, s.state AS s_state,
       s.node_id AS s_node_id, s.instance AS s_instance, s.attempt AS s_attempt,
       s.chosen AS s_chosen, s.started_at AS s_started_at, s.ended_at AS s_ended_at,
       n.node_id AS n_node_id, n.instance AS n_instance, n.drain AS n_drain,
       n.expires_at > mediator_now(%(now)s) AS n_live,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                        'node_id', l.node_id, 'instance', l.instance,
                        'drain', coalesce(ln.drain, '')) ORDER BY l.node_id)
                 FROM leases l LEFT JOIN nodes ln ON ln.node_id = l.node_id
                 WHERE l.run_id = r.run_id), '[]'::jsonb) AS leases
FROM runs r
LEFT JOIN steps s ON s.run_id = r.run_id
LEFT JOIN nodes n ON n.node_id = %(node_id)s
WHERE r.run_id = %(run_id)s
ORDER BY s.seq

-- apply_result --
-- A result's whole write in one statement (issue 13), as mediator.progress decided it from
-- result_source: the step's new state, the dependants SKIPPED, the asks raised, the leases
-- released, the run settled or ended, its asks closed, the events in order. The guard `g` is the
-- run row: it matches only if the run's version is still the one read — every statement that
-- wrote the run or its steps since bumped it — and the at-boundary nodes of its leases and the
-- reporting node's instance are still as read (an advert changes the node row, not the run).
-- Every other part reads `g`, so a failed guard writes nothing and returns no row: the flow reads
-- again and decides again. When the run settles, the row also carries its record's source. The run row is taken first, then steps, leases and asks: the locking
-- order of docs/design.md §9. Two results of one run serialise on the run row; the second finds
-- the version moved, so exactly one of them sees the run's last open step end and settles it.
-- State targets are parameters checked against mediator.states by the store (%(…_to)s from the
-- rows in %(…_from)s); run_to NULL leaves the run's state alone.
WITH g AS (
    UPDATE runs
    SET version  = version + 1,
        state    = coalesce(%(run_to)s::text, state),
        verdict  = CASE WHEN %(run_to)s::text IS NULL THEN verdict ELSE %(verdict)s::text END,
        ended_at = CASE WHEN %(run_to)s::text IS NULL THEN ended_at ELSE mediator_now(%(now)s) END
    WHERE run_id = %(run_id)s AND version = %(version)s
      AND (%(run_to)s::text IS NULL OR state = ANY(%(run_from)s::text[]))
      AND coalesce((SELECT instance FROM nodes WHERE node_id = %(node_id)s), '')
          = %(node_instance)s
      AND coalesce((SELECT array_agg(l.node_id ORDER BY l.node_id)
                    FROM leases l JOIN nodes n ON n.node_id = l.node_id
                    WHERE l.run_id = %(run_id)s AND n.drain = 'at-boundary'), '{}')
          = %(boundary)s::text[]
    RETURNING run_id, state, verdict, ended_at, contract
), fin AS (
    UPDATE steps s
    SET state    = %(step_to)s::text,
        log      = s.log || %(log)s::text,
        ended_at = CASE WHEN %(step_ends)s::boolean THEN mediator_now(%(now)s) ELSE s.ended_at END
    FROM g
    WHERE s.run_id = %(run_id)s AND s.seq = %(seq)s::integer AND s.run_id = g.run_id
      AND s.state = ANY(%(step_from)s::text[])
    RETURNING s.seq, s.log
), sk AS (
    UPDATE steps s SET state = %(skip_to)s::text, ended_at = mediator_now(%(now)s)
    FROM g
    WHERE s.run_id = g.run_id AND s.seq = ANY(%(skips)s::integer[])
      AND s.state = ANY(%(skip_from)s::text[])
    RETURNING s.seq
), due AS (
    SELECT s.run_id, s.seq, s.ask
    FROM steps s JOIN g ON g.run_id = s.run_id
    WHERE s.seq = ANY(%(asks)s::integer[]) AND s.kind = 'ask'
      AND s.state = ANY(%(ask_from)s::text[])
), asked AS (
    UPDATE steps s SET state = %(ask_to)s::text, started_at = mediator_now(%(now)s)
    FROM due
    WHERE s.run_id = due.run_id AND s.seq = due.seq AND s.state = ANY(%(ask_from)s::text[])
    RETURNING s.seq
), ins AS (
    INSERT INTO asks (run_id, seq, question, raised_at)
    SELECT run_id, seq, ask, mediator_now(%(now)s) FROM due ORDER BY seq
    RETURNING ask_id, run_id, seq, question, raised_at
), rel AS (
    DELETE FROM leases l USING g
    WHERE l.run_id = g.run_id AND l.node_id = ANY(%(release)s::text[])
    RETURNING l.node_id
), ca AS (
    UPDATE asks a SET closed = true
    FROM g
    WHERE a.run_id = g.run_id AND NOT a.closed AND %(close_asks)s::boolean
), ev AS (
    INSERT INTO events (at, run_id, node_id, kind, data)
    SELECT mediator_now(%(now)s), e.run_id, e.node_id, e.kind, e.data
    FROM (
        SELECT g.run_id, x.node_id, x.kind, x.data, x.ord AS ord
        FROM g, ROWS FROM (jsonb_to_recordset(%(head)s::jsonb)
                           AS (node_id text, kind text, data jsonb)) WITH ORDINALITY
                AS x(node_id, kind, data, ord)
        UNION ALL
        SELECT i.run_id, '', 'ask_raised', jsonb_build_object('ask_id', i.ask_id, 'seq', i.seq),
               1000000 + i.seq
        FROM ins i
        UNION ALL
        SELECT g.run_id, x.node_id, x.kind, x.data, 2000000 + x.ord
        FROM g, ROWS FROM (jsonb_to_recordset(%(tail)s::jsonb)
                           AS (node_id text, kind text, data jsonb)) WITH ORDINALITY
                AS x(node_id, kind, data, ord)
        UNION ALL
        SELECT g.run_id, r.node_id, 'lease_released',
               jsonb_build_object('reason', %(release_reason)s::text),
               3000000 + row_number() OVER (ORDER BY r.node_id)
        FROM g, rel r
    ) e
    ORDER BY e.ord
    RETURNING id, at, run_id, node_id, kind, data
)
SELECT g.run_id,
       coalesce((SELECT array_agg(node_id ORDER BY node_id) FROM rel), '{}') AS released,
       i.ask_id, i.seq, i.question, i.raised_at,
       -- When the run settles: its record's source as seal_source would read it after the
       -- commit (docs/design.md §12) — the events before and those just written, the step logs
       -- as this statement leaves them — so the seal needs no read of its own (issue 13).
       CASE WHEN %(run_to)s::text IS NOT NULL THEN g.state END AS seal_state,
       g.verdict AS seal_verdict, g.ended_at AS seal_ended_at, g.contract AS seal_contract,
       CASE WHEN %(run_to)s::text IS NOT NULL THEN
           (SELECT coalesce(jsonb_agg(jsonb_build_object(
                       'id', x.id, 'at', x.at, 'run_id', x.run_id, 'node_id', x.node_id,
                       'kind', x.kind, 'data', x.data) ORDER BY x.id), '[]'::jsonb)
            FROM (SELECT id, at, run_id, node_id, kind, data FROM events
                  WHERE run_id = g.run_id
                  UNION ALL
                  SELECT id, at, run_id, node_id, kind, data FROM ev) x)
       END AS seal_events,
       CASE WHEN %(run_to)s::text IS NOT NULL THEN
           (SELECT coalesce(jsonb_agg(jsonb_build_array(
                       s.seq, s.name, coalesce(f.log, s.log)) ORDER BY s.seq), '[]'::jsonb)
            FROM steps s LEFT JOIN fin f ON f.seq = s.seq
            WHERE s.run_id = g.run_id)
       END AS seal_logs
FROM g LEFT JOIN ins i ON true
ORDER BY i.seq

-- promote --
-- A promotion in one statement (issue 13), as create_run is a submit's: QUEUED → RUNNING only if
-- the run is still QUEUED (R8: a concurrent promotion or cancel makes it no row, nothing written),
-- its leases in node_id order (docs/design.md §9; a primary-key conflict fails the whole
-- statement: NodeTaken, R9, I1), the exec steps' node_id and runAcquires' `chosen` (R12), the ask
-- steps due at once PENDING → ASKED with their asks, and the events: promoted, lease_granted…,
-- ask_raised…. The run row is taken first (its version bumped, as every write to a run does).
-- One row per ask raised (ask_* NULL when none); no row: not promoted.
WITH run AS (
    UPDATE runs SET state = %(run_to)s::text, assigned = %(assigned)s::jsonb,
                    started_at = mediator_now(%(now)s), version = version + 1
    WHERE run_id = %(run_id)s AND state = ANY(%(run_from)s::text[])
    RETURNING run_id
), ls AS (
    INSERT INTO leases (node_id, run_id, instance, granted_at, not_after)
    SELECT x.node_id, r.run_id, x.instance, mediator_now(%(now)s),
           mediator_now(%(now)s) + make_interval(secs => %(ttl)s::float8)
    FROM run r, jsonb_to_recordset(%(leases)s::jsonb) AS x(node_id text, instance text)
    ORDER BY x.node_id
    RETURNING node_id
), st AS (
    UPDATE steps s
    SET node_id = %(assigned)s::jsonb ->> s.role,
        chosen  = %(chosen)s::jsonb -> s.role
    FROM run r
    WHERE s.run_id = r.run_id AND s.kind = 'exec'
), due AS (
    SELECT s.run_id, s.seq, s.ask
    FROM steps s JOIN run r ON r.run_id = s.run_id
    WHERE s.kind = 'ask' AND s.state = ANY(%(ask_from)s::text[])
      AND NOT EXISTS (
          SELECT 1 FROM steps d
          WHERE d.run_id = s.run_id AND d.state <> 'PASSED'
            AND d.name IN (SELECT jsonb_array_elements_text(s.after)))
), asked AS (
    UPDATE steps s SET state = %(ask_to)s::text, started_at = mediator_now(%(now)s)
    FROM due
    WHERE s.run_id = due.run_id AND s.seq = due.seq AND s.state = ANY(%(ask_from)s::text[])
    RETURNING s.seq
), ins AS (
    INSERT INTO asks (run_id, seq, question, raised_at)
    SELECT run_id, seq, ask, mediator_now(%(now)s) FROM due ORDER BY seq
    RETURNING ask_id, run_id, seq, question, raised_at
), ev AS (
    INSERT INTO events (at, run_id, node_id, kind, data)
    SELECT mediator_now(%(now)s), e.run_id, e.node_id, e.kind, e.data
    FROM (
        SELECT r.run_id, x.node_id, x.kind, x.data, x.ord AS ord
        FROM run r, ROWS FROM (jsonb_to_recordset(%(events)s::jsonb)
                               AS (node_id text, kind text, data jsonb)) WITH ORDINALITY
                    AS x(node_id, kind, data, ord)
        UNION ALL
        SELECT i.run_id, '', 'ask_raised', jsonb_build_object('ask_id', i.ask_id, 'seq', i.seq),
               1000000 + i.seq
        FROM ins i
    ) e
    ORDER BY e.ord
)
SELECT r.run_id, i.ask_id, i.seq, i.question, i.raised_at
FROM run r LEFT JOIN ins i ON true
ORDER BY i.seq

-- sweep_head --
-- A sweep's first read in one statement (issue 13): the needs classes waiting, the live fleet
-- (LiveAdverts + BusyNodes + DrainingNodes: the matcher's whole input) and the head of the
-- queue in FIFO order (R6: created_at, run_id) — told apart by `part`. The sweep pages on with
-- queued_page only past a full head.
-- Classes (docs/design.md §6 "Sweeps remember"): with %(since)s NULL, every class waiting (a
-- loose index scan over runs_queue_class: one probe per class, P2). With %(since)s the `mark`
-- of this process's last read, only the classes whose waiting may have changed since: those of
-- the runs queued since (runs_queue_tx) and of the runs some event since names (events_tx) that
-- are no longer QUEUED, each with its needs when it still waits, NULL when it no longer does —
-- so the read follows what changed, not how many classes wait. Every transaction this read
-- cannot see has an id ≥ its snapshot's xmin, returned as `mark` (the events stream's rule,
-- issue 13 §6). Read in full instead when %(since)s is past the server's ids (another
-- database) or more than 4,096 events happened since (a long quiet process).
-- The `mark` row always comes, with `mark`, `whole` (every class was read) and `queued`
-- (whether any run is QUEUED). Nodes and runs come only when one is, so an empty queue costs this one
-- statement and one row (R13's cost argument).
-- With %(sealed)s a run id, the statement first marks that run's record sealed (mark_sealed's
-- update): a seal whose wake follows sends one statement for both, after the terminal commit
-- (issue 13). NULL marks nothing.
-- With %(guard)s true (R17's guard, docs/design.md R17 "The guard's first read"): if at most 64
-- classes wait and each has a role that no live, free (unleased), undrained node might meet
-- (fleet_for's superset test, so no node the matcher would take is missed), no sweep reading
-- this snapshot could promote anything: `blocked` is true and nothing but the mark row comes —
-- no class, node or run is read. The classes are found one probe each (the loose index scan
-- below), 65 at most. False (every other sweep) reads as before.
WITH RECURSIVE m AS (
    UPDATE runs SET sealed = true
    WHERE run_id = %(sealed)s AND state IN ('PASSED', 'FAILED')
), wk(needs_key) AS (
    (SELECT needs_key FROM runs
     WHERE state = 'QUEUED' AND %(guard)s::boolean ORDER BY needs_key LIMIT 1)
    UNION ALL
    SELECT (SELECT r.needs_key FROM runs r
            WHERE r.state = 'QUEUED' AND r.needs_key > wk.needs_key
            ORDER BY r.needs_key LIMIT 1)
    FROM wk WHERE wk.needs_key IS NOT NULL
), b AS (
    SELECT coalesce(%(guard)s::boolean AND count(*) <= 64 AND bool_and(w.stuck), false) AS blocked
    FROM (
        SELECT EXISTS (
            SELECT 1 FROM needs_classes c, jsonb_each(c.needs) AS r(role, need)
            WHERE c.needs_key = w.needs_key
              AND NOT EXISTS (
                  SELECT 1 FROM nodes n
                  WHERE n.expires_at > mediator_now(%(now)s) AND n.drain = ''
                    AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.node_id = n.node_id)
                    AND NOT EXISTS (
                        SELECT 1 FROM jsonb_each(r.need) AS q(k, v)
                        WHERE NOT {{capability_fits}}))) AS stuck
        FROM (SELECT needs_key FROM wk WHERE needs_key IS NOT NULL LIMIT 65) w
    ) w
), snap AS (
    SELECT pg_snapshot_xmin(pg_current_snapshot()) AS mark,
           pg_snapshot_xmax(pg_current_snapshot()) AS xmax
), head AS (
    SELECT r.needs_key, r.run_id, r.created_at FROM runs r
    WHERE r.state = 'QUEUED'
    ORDER BY r.created_at, r.run_id
    LIMIT %(limit)s
), ev AS (
    SELECT e.run_id FROM events e  -- bounded on both sides: an index range, whatever the
    WHERE e.tx >= %(since)s::text::xid8    -- statistics say (a history keeps every event)
      AND e.tx < pg_snapshot_xmax(pg_current_snapshot()) AND e.run_id <> ''
    LIMIT 4097
), mode AS (
    SELECT NOT b.blocked AND (%(since)s::text::xid8 IS NULL OR %(since)s::text::xid8 > xmax
                              OR (SELECT count(*) FROM ev) > 4096) AS whole,
           NOT b.blocked AND EXISTS (SELECT 1 FROM head) AS queued
    FROM snap, b
), k(needs_key) AS (
    (SELECT needs_key FROM runs
     WHERE state = 'QUEUED' AND (SELECT whole FROM mode) ORDER BY needs_key LIMIT 1)
    UNION ALL
    SELECT (SELECT r.needs_key FROM runs r
            WHERE r.state = 'QUEUED' AND r.needs_key > k.needs_key
            ORDER BY r.needs_key LIMIT 1)
    FROM k WHERE k.needs_key IS NOT NULL
), d(needs_key) AS (
    SELECT r.needs_key FROM runs r
    WHERE NOT (SELECT whole FROM mode) AND r.state = 'QUEUED'
      AND r.queued_tx >= %(since)s::text::xid8
    UNION
    SELECT x.needs_key FROM (  -- each run an event names, by its key (a probe each)
        SELECT (SELECT r.needs_key FROM runs r
                WHERE r.run_id = e.run_id AND r.state <> 'QUEUED') AS needs_key
        FROM (SELECT DISTINCT run_id FROM ev) e WHERE NOT (SELECT whole FROM mode)
    ) x WHERE x.needs_key IS NOT NULL
), cls AS (
    SELECT c.needs_key, c.needs FROM k JOIN needs_classes c ON c.needs_key = k.needs_key
    UNION ALL
    SELECT d.needs_key,  -- per class, by its keys (a probe each, whatever the statistics say)
           CASE WHEN EXISTS (SELECT 1 FROM runs q
                             WHERE q.state = 'QUEUED' AND q.needs_key = d.needs_key
                             ORDER BY q.needs_key LIMIT 1)
                THEN (SELECT c.needs FROM needs_classes c WHERE c.needs_key = d.needs_key) END
    FROM d
)
SELECT 'mark' AS part, NULL::text AS needs_key, NULL::text AS needs, NULL::text AS node_id,
       NULL::jsonb AS capabilities, NULL::text AS instance, NULL::text AS drain,
       NULL::boolean AS busy, NULL::text AS run_id, NULL::timestamptz AS created_at,
       s.mark::text AS mark, md.whole, md.queued, b.blocked
FROM snap s, mode md, b
UNION ALL
SELECT 'class', c.needs_key, c.needs::text, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL
FROM cls c WHERE NOT (SELECT blocked FROM b)
UNION ALL
SELECT 'node', NULL, NULL::text, n.node_id, n.capabilities, n.instance, n.drain,
       (l.node_id IS NOT NULL), NULL, NULL, NULL, NULL, NULL, NULL
FROM nodes n
LEFT JOIN leases l ON l.node_id = n.node_id
WHERE n.expires_at > mediator_now(%(now)s) AND (SELECT queued FROM mode)
UNION ALL
SELECT 'queued', h.needs_key, NULL::text, NULL, NULL, NULL, NULL, NULL, h.run_id, h.created_at,
       NULL, NULL, NULL, NULL
FROM head h WHERE NOT (SELECT blocked FROM b)

-- event_position --
-- Where a /v1/events stream starts, as (tx, id) (events_since's order). After event %(id)s: that
-- event's place, else just before the first event after it, else the horizon. From now on (id
-- NULL): the last event below the horizon, so one still in flight is delivered when it commits.
SELECT coalesce(e.tx, a.tx, l.tx,
                CASE WHEN %(id)s::bigint IS NULL THEN '0'::xid8
                     ELSE pg_snapshot_xmin(pg_current_snapshot()) END)::text AS tx,
       coalesce(%(id)s::bigint, l.id, 0) AS id
FROM (SELECT 1) AS one
LEFT JOIN LATERAL (SELECT tx FROM events WHERE id = %(id)s::bigint) AS e ON true
LEFT JOIN LATERAL (SELECT min(tx) AS tx FROM events WHERE id > %(id)s::bigint) AS a ON true
LEFT JOIN LATERAL (SELECT tx, id FROM events
                   WHERE %(id)s::bigint IS NULL
                     AND tx < pg_snapshot_xmin(pg_current_snapshot())
                   ORDER BY tx DESC, id DESC LIMIT 1) AS l ON true

-- run_totals --
-- Runs in every state, for /metrics' mediator_runs gauge only (scraped, not polled by the panel):
-- the terminal states have no index of their own, so this reads every run.
SELECT state, count(*) AS n FROM runs GROUP BY state

-- gap_lock --
-- Time you can trust (docs/design.md §13): one give-back at a time across every Mediator process
-- on this database, so two that notice the same gap cannot both read "not given back yet".
-- Transaction-scoped: released at commit.
SELECT pg_advisory_xact_lock(%(key)s)

-- give_back --
-- Give adverts and leases back a gap of %(secs)s seconds that ended now (a stall, an outage) or
-- spans [%(began)s, %(ended)s] (a jump of the database's clock), less what the gaps of its family
-- recorded over an overlapping interval gave back already; nothing below %(minimum)s seconds.
-- Families: jumps (one step of the clock, seen by several processes), and stalls with outages
-- (real time in which heartbeats could not land: a frozen host is often both). Shifted as an
-- outage always was: what was live when the gap began gets the time back, capped at one TTL from
-- now (so a gap given twice never gives a node more than a fresh advert would). The gap is
-- recorded with what it gave; rows older than a day are dropped. Runs under gap_lock; returns the seconds given back (no row: nothing).
WITH span AS (
    SELECT coalesce(%(began)s::timestamptz,
                    mediator_now(%(now)s) - make_interval(secs => %(secs)s::float8)) AS began_at,
           coalesce(%(ended)s::timestamptz, mediator_now(%(now)s)) AS ended_at
), rest AS (
    SELECT s.began_at, s.ended_at,
           %(secs)s::float8 - coalesce((SELECT sum(g.seconds) FROM gaps g
                                        WHERE g.kind = ANY(%(family)s)
                                          AND g.began_at < s.ended_at
                                          AND g.ended_at > s.began_at), 0) AS secs
    FROM span s
), due AS (
    SELECT * FROM rest WHERE secs >= %(minimum)s::float8 AND secs > 0
), shifted_nodes AS (
    UPDATE nodes
    SET expires_at = least(expires_at + make_interval(secs => due.secs),
                           mediator_now(%(now)s) + make_interval(secs => %(advert_ttl)s::float8))
    FROM due
    WHERE expires_at > mediator_now(%(now)s) - make_interval(secs => due.secs)
    RETURNING 1
), shifted_leases AS (
    UPDATE leases
    SET not_after = least(not_after + make_interval(secs => due.secs),
                          mediator_now(%(now)s) + make_interval(secs => %(lease_ttl)s::float8))
    FROM due
    WHERE not_after > mediator_now(%(now)s) - make_interval(secs => due.secs)
    RETURNING 1
), pruned AS (
    DELETE FROM gaps WHERE ended_at < mediator_now(%(now)s) - interval '1 day'
)
INSERT INTO gaps (kind, began_at, ended_at, seconds, noticed_at)
SELECT %(kind)s, began_at, ended_at, secs, mediator_now(%(now)s) FROM due
RETURNING seconds

-- gap_fleet --
-- Submit's last look before refusing a run for good (docs/design.md §13): within %(grace)s
-- seconds after a gap ended, the nodes that were live when it began — live now, or expired
-- since, perhaps only because of the gap. None when no gap ended that recently. %(open_s)s:
-- an outage that has ended but is not given back yet began that many seconds ago (NULL: none);
-- it counts as such a gap (LEAST ignores a NULL).
SELECT n.node_id, n.capabilities, n.expires_at <= mediator_now(%(now)s) AS expired
FROM nodes n
WHERE n.expires_at >= least(
    (SELECT min(g.began_at) FROM gaps g
     WHERE g.ended_at > mediator_now(%(now)s) - make_interval(secs => %(grace)s::float8)),
    mediator_now(%(now)s) - make_interval(secs => %(open_s)s::float8))
ORDER BY n.node_id
