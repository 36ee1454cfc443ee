"""Versioned migrations of one namespace's schema.

Each migration is a list of statements with ``@s@`` standing for the quoted schema and
``@channel@`` for the quoted NOTIFY channel literal. Migrations are append-only: a released one
is never edited, a change is a new version.
"""

from __future__ import annotations

MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "log, queue and stream tables, with their functions",
        [
            # --- log -------------------------------------------------------------------------
            # COLLATE "C": ids compare by UTF-8 bytes, which is code-point order (list_logs).
            """
            CREATE TABLE @s@.logs (
                log_id text COLLATE "C" PRIMARY KEY,
                status text COLLATE "C"
            )
            """,
            "CREATE INDEX logs_status ON @s@.logs (status, log_id) WHERE status IS NOT NULL",
            """
            CREATE TABLE @s@.events (
                log_id text COLLATE "C" NOT NULL,
                seq bigint NOT NULL,
                key text COLLATE "C",
                data bytea NOT NULL,
                batch uuid,
                CONSTRAINT events_pkey PRIMARY KEY (log_id, seq)
            )
            """,
            "CREATE UNIQUE INDEX events_key ON @s@.events (log_id, key) WHERE key IS NOT NULL",
            # --- queue -----------------------------------------------------------------------
            # A live message has dead_at NULL; visible_at is its delay end or lease deadline.
            """
            CREATE TABLE @s@.messages (
                id text COLLATE "C" PRIMARY KEY,
                seq bigint GENERATED ALWAYS AS IDENTITY,
                queue text COLLATE "C" NOT NULL,
                payload bytea NOT NULL,
                visible_at timestamptz NOT NULL,
                attempts integer NOT NULL DEFAULT 0,
                max_attempts integer NOT NULL,
                dedup_key text COLLATE "C",
                token uuid,
                last_token uuid,
                worker text,
                dead_at timestamptz,
                reason text
            )
            """,
            """
            CREATE INDEX messages_ready ON @s@.messages (queue, visible_at, seq)
            WHERE dead_at IS NULL
            """,
            """
            CREATE UNIQUE INDEX messages_dedup ON @s@.messages (queue, dedup_key)
            WHERE dedup_key IS NOT NULL AND dead_at IS NULL
            """,
            """
            CREATE INDEX messages_dead ON @s@.messages (queue, dead_at, seq)
            WHERE dead_at IS NOT NULL
            """,
            # --- stream ----------------------------------------------------------------------
            """
            CREATE TABLE @s@.streams (
                stream_id text COLLATE "C" PRIMARY KEY,
                next_index bigint NOT NULL DEFAULT 0,
                closed boolean NOT NULL DEFAULT false
            )
            """,
            """
            CREATE TABLE @s@.chunks (
                stream_id text COLLATE "C" NOT NULL,
                idx bigint NOT NULL,
                data bytea NOT NULL,
                batch uuid,
                PRIMARY KEY (stream_id, idx)
            )
            """,
            # --- wake: NOTIFY only when some World waits for this tag ----------------------
            # A committing NOTIFY holds a database-wide lock through its commit (and fsync), so
            # notifying every write would serialise all writers. Waiting Worlds register a tag
            # by holding a shared session lock (class @kr@) on their listener connection;
            # writers notify only when they cannot take that lock. Each writer also holds a
            # shared transaction lock (class @kw@) until it commits: a new registrant takes
            # that one exclusively once, so every writer that saw no registrant has committed
            # before the registrant looks at the data again.
            """
            CREATE FUNCTION @s@.wake(p_tag text) RETURNS void
            LANGUAGE plpgsql AS $fn$
            DECLARE
                k integer := ('x' || substr(p_tag, 2, 8))::bit(32)::integer;
            BEGIN
                PERFORM pg_advisory_xact_lock_shared(@kw@, k);
                -- IF conditions, not PERFORM: plpgsql evaluates them without the executor.
                IF NOT pg_try_advisory_lock(@kr@, k) THEN
                    PERFORM pg_notify(@channel@, p_tag);
                ELSIF NOT pg_advisory_unlock(@kr@, k) THEN
                    RAISE EXCEPTION 'wake: advisory lock vanished';
                END IF;
            END
            $fn$
            """,
            # --- append: one round trip ------------------------------------------------------
            # seq is max+1 and settled by events_pkey: a concurrent appender that took the same
            # seq fails with a unique violation of events_pkey and the client retries. The
            # shared advisory lock only orders appends against delete (exclusive), so that a
            # delete never leaves a hole. batch marks the batch's last event, so that a retry
            # after a lost connection can tell whether the first try committed.
            """
            CREATE FUNCTION @s@.append(
                p_log text, p_data bytea[], p_keys text[], p_expect bigint, p_status text,
                p_batch uuid, p_retry boolean, p_tag text,
                p_mid text[], p_mqueue text[], p_mpayload bytea[], p_mdelay float8[],
                p_mdedup text[], p_mmax integer[], p_mtag text[],
                OUT o_tail bigint, OUT o_actual bigint,
                OUT o_dup_seq bigint, OUT o_dup_key text, OUT o_dup_data bytea)
            LANGUAGE plpgsql AS $fn$
            DECLARE
                t bigint;
                n integer := cardinality(p_data);
                q text;
                k integer := ('x' || substr(p_tag, 2, 8))::bit(32)::integer;
            BEGIN
                -- The second lock is wake()'s writer lock, taken here with the first.
                PERFORM pg_advisory_xact_lock_shared(hashtext(@s_literal@), hashtext(p_log)),
                        pg_advisory_xact_lock_shared(@kw@, k);
                IF p_retry THEN
                    SELECT e.seq INTO o_tail FROM @s@.events e
                    WHERE e.log_id = p_log AND e.batch = p_batch;
                    IF FOUND THEN RETURN; END IF;
                END IF;
                SELECT coalesce(max(e.seq), 0) INTO t FROM @s@.events e WHERE e.log_id = p_log;
                IF p_expect IS NOT NULL AND p_expect <> t THEN
                    o_actual := t;
                    RETURN;
                END IF;
                IF p_keys IS NOT NULL THEN
                    SELECT e.seq, e.key, e.data INTO o_dup_seq, o_dup_key, o_dup_data
                    FROM @s@.events e WHERE e.log_id = p_log AND e.key = ANY (p_keys)
                    ORDER BY e.seq LIMIT 1;
                    IF FOUND THEN RETURN; END IF;
                END IF;
                INSERT INTO @s@.events (log_id, seq, key, data, batch)
                SELECT p_log, t + u.i, u.k, u.d, CASE WHEN u.i = n THEN p_batch END
                FROM unnest(p_data, p_keys) WITH ORDINALITY AS u (d, k, i);
                IF t = 0 OR p_status IS NOT NULL THEN
                    INSERT INTO @s@.logs AS l (log_id, status) VALUES (p_log, p_status)
                    ON CONFLICT (log_id) DO UPDATE SET status = coalesce(EXCLUDED.status, l.status);
                END IF;
                IF p_mid IS NOT NULL THEN
                    INSERT INTO @s@.messages
                        (id, queue, payload, visible_at, max_attempts, dedup_key)
                    SELECT m.id, m.q, m.p, now() + m.d * interval '1 second', m.x, m.k
                    FROM unnest(p_mid, p_mqueue, p_mpayload, p_mdelay, p_mmax, p_mdedup)
                        AS m (id, q, p, d, x, k)
                    ON CONFLICT DO NOTHING;
                    FOR q IN SELECT DISTINCT m.tag FROM unnest(p_mtag, p_mdelay) AS m (tag, d)
                             WHERE m.d = 0 LOOP
                        PERFORM @s@.wake(q);
                    END LOOP;
                END IF;
                IF NOT pg_try_advisory_lock(@kr@, k) THEN  -- wake(p_tag), inline
                    PERFORM pg_notify(@channel@, p_tag);
                ELSIF NOT pg_advisory_unlock(@kr@, k) THEN
                    RAISE EXCEPTION 'append: advisory lock vanished';
                END IF;
                o_tail := t + n;
            END
            $fn$
            """,
            # --- delete: waits for appends in flight, then removes what they wrote ----------
            """
            CREATE FUNCTION @s@.delete_log(p_log text) RETURNS void
            LANGUAGE plpgsql AS $fn$
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtext(@s_literal@), hashtext(p_log));
                DELETE FROM @s@.events WHERE log_id = p_log;
                DELETE FROM @s@.logs WHERE log_id = p_log;
            END
            $fn$
            """,
            # --- enqueue: insert, or the live message holding the dedup key -----------------
            """
            CREATE FUNCTION @s@.enqueue(
                p_id text, p_queue text, p_payload bytea, p_delay float8, p_max integer,
                p_dedup text, p_tag text)
            RETURNS text LANGUAGE plpgsql AS $fn$
            DECLARE
                r text;
            BEGIN
                INSERT INTO @s@.messages (id, queue, payload, visible_at, max_attempts, dedup_key)
                VALUES (p_id, p_queue, p_payload, now() + p_delay * interval '1 second', p_max,
                        p_dedup)
                ON CONFLICT DO NOTHING
                RETURNING id INTO r;
                IF FOUND THEN
                    IF p_delay = 0 THEN PERFORM @s@.wake(p_tag); END IF;
                    RETURN r;
                END IF;
                -- A retry whose first try committed, or a dedup hit (fresh snapshot: the
                -- conflicting row is committed by now).
                SELECT m.id INTO r FROM @s@.messages m WHERE m.id = p_id;
                IF FOUND THEN RETURN r; END IF;
                SELECT m.id INTO r FROM @s@.messages m
                WHERE m.queue = p_queue AND m.dedup_key = p_dedup AND m.dead_at IS NULL;
                RETURN r;
            END
            $fn$
            """,
            # --- stream delete: the row lock first, so no write in flight leaves chunks -------
            """
            CREATE FUNCTION @s@.delete_stream(p_id text) RETURNS void
            LANGUAGE plpgsql AS $fn$
            BEGIN
                DELETE FROM @s@.streams WHERE stream_id = p_id;
                DELETE FROM @s@.chunks WHERE stream_id = p_id;
            END
            $fn$
            """,
            # --- stream write: the stream row's lock orders writers -------------------------
            """
            CREATE FUNCTION @s@.write(
                p_id text, p_chunks bytea[], p_expect bigint, p_batch uuid, p_retry boolean,
                p_tag text, OUT o_next bigint, OUT o_closed boolean, OUT o_actual bigint)
            LANGUAGE plpgsql AS $fn$
            DECLARE
                n integer := cardinality(p_chunks);
                base bigint;
                c boolean;
            BEGIN
                IF p_retry THEN
                    SELECT k.idx + 1 INTO o_next FROM @s@.chunks k
                    WHERE k.stream_id = p_id AND k.batch = p_batch;
                    IF FOUND THEN RETURN; END IF;
                END IF;
                UPDATE @s@.streams s SET next_index = s.next_index + n
                WHERE s.stream_id = p_id AND NOT s.closed
                  AND (p_expect IS NULL OR s.next_index = p_expect)
                RETURNING s.next_index - n INTO base;
                IF NOT FOUND THEN
                    LOOP
                        SELECT s.next_index, s.closed INTO base, c FROM @s@.streams s
                        WHERE s.stream_id = p_id FOR UPDATE;
                        EXIT WHEN FOUND;
                        INSERT INTO @s@.streams (stream_id) VALUES (p_id) ON CONFLICT DO NOTHING;
                    END LOOP;
                    IF c THEN
                        o_closed := true;
                        o_actual := base;
                        RETURN;
                    END IF;
                    IF p_expect IS NOT NULL AND p_expect <> base THEN
                        o_actual := base;
                        RETURN;
                    END IF;
                    UPDATE @s@.streams s SET next_index = base + n WHERE s.stream_id = p_id;
                END IF;
                INSERT INTO @s@.chunks (stream_id, idx, data, batch)
                SELECT p_id, base + u.i - 1, u.d, CASE WHEN u.i = n THEN p_batch END
                FROM unnest(p_chunks) WITH ORDINALITY AS u (d, i);
                PERFORM @s@.wake(p_tag);
                o_next := base + n;
            END
            $fn$
            """,
        ],
    ),
    (
        "delete_log also waits for single-event appends, which lock the logs row",
        [
            # A single-event append to an existing log is one INSERT (``_APPEND_ONE`` in
            # _log.py) that holds a KEY SHARE lock on the log's row instead of the shared
            # advisory lock, which a statement could only take after its snapshot. Deleting
            # the row first waits for those appends to commit and makes later ones find no
            # row (they then go through append(), which waits for the advisory lock); the
            # events are deleted by the next statement, whose snapshot has them all.
            """
            CREATE OR REPLACE FUNCTION @s@.delete_log(p_log text) RETURNS void
            LANGUAGE plpgsql AS $fn$
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtext(@s_literal@), hashtext(p_log));
                DELETE FROM @s@.logs WHERE log_id = p_log;
                DELETE FROM @s@.events WHERE log_id = p_log;
            END
            $fn$
            """,
        ],
    ),
    (
        "delete_log deletes events until none is left, for appends that lock the tail event",
        [
            # A single-event append (``_APPEND_ONE`` in _log.py) now holds a KEY SHARE lock on
            # the log's tail event instead of its logs row, saving the row's lookup. A delete
            # that reaches a locked event waits for that append's commit, but its statement's
            # snapshot predates the appended event: the next statement, with a fresh snapshot,
            # deletes it, and so on until one deletes nothing. An append that locks an event
            # after the delete removed it waits for the delete's commit, then skips every
            # removed event and finds no tail (it then goes through append(), which waits for
            # the advisory lock). The logs row is still deleted first, so that an append of
            # version 2, which locks it, is waited for too. Each pass locks the events from
            # the tail down before deleting any: the event an append locked is the first one
            # the delete waits for, so it holds no other event meanwhile, and an append of a
            # key the log already holds is refused at once instead of waiting for the delete
            # while the delete waits for it (a deadlock PostgreSQL would break only after
            # deadlock_timeout).
            """
            CREATE OR REPLACE FUNCTION @s@.delete_log(p_log text) RETURNS void
            LANGUAGE plpgsql AS $fn$
            BEGIN
                PERFORM pg_advisory_xact_lock(hashtext(@s_literal@), hashtext(p_log));
                DELETE FROM @s@.logs WHERE log_id = p_log;
                LOOP
                    DELETE FROM @s@.events WHERE (log_id, seq) IN (
                        SELECT e.log_id, e.seq FROM @s@.events e WHERE e.log_id = p_log
                        ORDER BY e.seq DESC FOR UPDATE OF e
                    );
                    EXIT WHEN NOT FOUND;
                END LOOP;
            END
            $fn$
            """,
        ],
    ),
    (
        "enqueue_batch: the enqueues a process makes at once, in one statement",
        [
            # Concurrent enqueues of one World are merged into one call (_merge.py). Each item
            # answers as enqueue() does: its own id when inserted (or already there: a retry
            # whose first try committed), else the id of the live message holding its dedup
            # key, looked up by a later statement so that it sees a holder that committed
            # while the INSERT waited for it, else NULL (that holder is gone: the client tries
            # again). Two items of one batch with one dedup key: the first is inserted, the
            # second finds it. Items are inserted in order of queue and dedup key, so that two
            # batches take the keys' index entries in one order and never wait for each other
            # in a circle (each would wait for the other's commit), then in the order they came:
            # seq follows that order. The calls of a batch were all in flight at once, so any
            # order among them is an enqueue order. Each tag with an inserted ready message is
            # woken once, in tag order.
            """
            CREATE FUNCTION @s@.enqueue_batch(
                p_ids text[], p_queues text[], p_payloads bytea[], p_delays float8[],
                p_max integer[], p_dedup text[], p_tags text[])
            RETURNS text[] LANGUAGE plpgsql AS $fn$
            DECLARE
                added text[];
                tags text[];
                found text[];
                t text;
            BEGIN
                WITH ins AS (
                    INSERT INTO @s@.messages
                        (id, queue, payload, visible_at, max_attempts, dedup_key)
                    SELECT u.id, u.q, u.p, now() + u.d * interval '1 second', u.x, u.k
                    FROM unnest(p_ids, p_queues, p_payloads, p_delays, p_max, p_dedup)
                        WITH ORDINALITY AS u (id, q, p, d, x, k, i)
                    ORDER BY u.q, u.k, u.i
                    ON CONFLICT DO NOTHING
                    RETURNING id
                )
                SELECT array_agg(u.id), array_agg(DISTINCT u.t) FILTER (WHERE u.d = 0)
                INTO added, tags
                FROM ins JOIN unnest(p_ids, p_tags, p_delays) AS u (id, t, d) ON u.id = ins.id;
                IF cardinality(added) = cardinality(p_ids) THEN
                    found := p_ids;
                ELSE
                    SELECT array_agg(CASE WHEN u.id = ANY (added) THEN u.id ELSE coalesce(
                        (SELECT m.id FROM @s@.messages m WHERE m.id = u.id),
                        (SELECT m.id FROM @s@.messages m WHERE m.queue = u.q
                         AND m.dedup_key = u.k AND m.dead_at IS NULL)) END ORDER BY u.i)
                    INTO found
                    FROM unnest(p_ids, p_queues, p_dedup) WITH ORDINALITY AS u (id, q, k, i);
                END IF;
                FOREACH t IN ARRAY coalesce(tags, '{}') LOOP
                    PERFORM @s@.wake(t);
                END LOOP;
                RETURN found;
            END
            $fn$
            """,
        ],
    ),
    (
        "append inserts its outbox messages in order of queue and dedup key",
        [
            # As enqueue_batch does: two appends whose messages hold the same dedup keys in
            # opposite orders took the keys' index entries in opposite orders, and each could
            # wait for the other's commit (a deadlock PostgreSQL breaks after deadlock_timeout,
            # failing one, which the client then retried). In key order, both take the first
            # key first. The messages keep their order where it counts, in seq (the claim's
            # enqueue order): their seqs are drawn in the order the caller gave them, then the
            # rows are inserted in key order with those seqs. A lone message (the journal's
            # appends carry one) is inserted as before. Otherwise append() is unchanged.
            """
            CREATE OR REPLACE FUNCTION @s@.append(
                p_log text, p_data bytea[], p_keys text[], p_expect bigint, p_status text,
                p_batch uuid, p_retry boolean, p_tag text,
                p_mid text[], p_mqueue text[], p_mpayload bytea[], p_mdelay float8[],
                p_mdedup text[], p_mmax integer[], p_mtag text[],
                OUT o_tail bigint, OUT o_actual bigint,
                OUT o_dup_seq bigint, OUT o_dup_key text, OUT o_dup_data bytea)
            LANGUAGE plpgsql AS $fn$
            DECLARE
                t bigint;
                n integer := cardinality(p_data);
                q text;
                k integer := ('x' || substr(p_tag, 2, 8))::bit(32)::integer;
                seqs bigint[] := '{}';
            BEGIN
                -- The second lock is wake()'s writer lock, taken here with the first.
                PERFORM pg_advisory_xact_lock_shared(hashtext(@s_literal@), hashtext(p_log)),
                        pg_advisory_xact_lock_shared(@kw@, k);
                IF p_retry THEN
                    SELECT e.seq INTO o_tail FROM @s@.events e
                    WHERE e.log_id = p_log AND e.batch = p_batch;
                    IF FOUND THEN RETURN; END IF;
                END IF;
                SELECT coalesce(max(e.seq), 0) INTO t FROM @s@.events e WHERE e.log_id = p_log;
                IF p_expect IS NOT NULL AND p_expect <> t THEN
                    o_actual := t;
                    RETURN;
                END IF;
                IF p_keys IS NOT NULL THEN
                    SELECT e.seq, e.key, e.data INTO o_dup_seq, o_dup_key, o_dup_data
                    FROM @s@.events e WHERE e.log_id = p_log AND e.key = ANY (p_keys)
                    ORDER BY e.seq LIMIT 1;
                    IF FOUND THEN RETURN; END IF;
                END IF;
                INSERT INTO @s@.events (log_id, seq, key, data, batch)
                SELECT p_log, t + u.i, u.k, u.d, CASE WHEN u.i = n THEN p_batch END
                FROM unnest(p_data, p_keys) WITH ORDINALITY AS u (d, k, i);
                IF t = 0 OR p_status IS NOT NULL THEN
                    INSERT INTO @s@.logs AS l (log_id, status) VALUES (p_log, p_status)
                    ON CONFLICT (log_id) DO UPDATE SET status = coalesce(EXCLUDED.status, l.status);
                END IF;
                IF cardinality(p_mid) = 1 THEN  -- one message (a submit's): no order to keep
                    INSERT INTO @s@.messages
                        (id, queue, payload, visible_at, max_attempts, dedup_key)
                    VALUES (p_mid[1], p_mqueue[1], p_mpayload[1],
                            now() + p_mdelay[1] * interval '1 second', p_mmax[1], p_mdedup[1])
                    ON CONFLICT DO NOTHING;
                ELSIF p_mid IS NOT NULL THEN
                    -- messages_seq_seq: the sequence of the identity column seq (version 1).
                    FOR j IN 1 .. cardinality(p_mid) LOOP  -- seqs in the messages' order
                        seqs := seqs || nextval('@s@.messages_seq_seq');
                    END LOOP;
                    INSERT INTO @s@.messages
                        (id, seq, queue, payload, visible_at, max_attempts, dedup_key)
                    OVERRIDING SYSTEM VALUE
                    SELECT m.id, m.n, m.q, m.p, now() + m.d * interval '1 second', m.x, m.k
                    FROM unnest(p_mid, seqs, p_mqueue, p_mpayload, p_mdelay, p_mmax, p_mdedup)
                        WITH ORDINALITY AS m (id, n, q, p, d, x, k, i)
                    ORDER BY m.q, m.k, m.i
                    ON CONFLICT DO NOTHING;
                END IF;
                IF p_mid IS NOT NULL THEN
                    FOR q IN SELECT DISTINCT m.tag FROM unnest(p_mtag, p_mdelay) AS m (tag, d)
                             WHERE m.d = 0 LOOP
                        PERFORM @s@.wake(q);
                    END LOOP;
                END IF;
                IF NOT pg_try_advisory_lock(@kr@, k) THEN  -- wake(p_tag), inline
                    PERFORM pg_notify(@channel@, p_tag);
                ELSIF NOT pg_advisory_unlock(@kr@, k) THEN
                    RAISE EXCEPTION 'append: advisory lock vanished';
                END IF;
                o_tail := t + n;
            END
            $fn$
            """,
        ],
    ),
]
