-- Revision 0027: chords (docs/jobs.md, "Chains, groups and chords"). A chord is a group of
-- jobs and a callback that runs once with the list of their results, when the last one
-- succeeded. Its row counts the members still pending; each member's result waits in its member
-- row. queue_pg.complete_step, in the transaction that deletes a member's message, fills its
-- row and takes one off `pending` under the chord's row lock, so of members finishing together
-- exactly one sees 0 and sends the callback; the chord's rows go with that send. A member is
-- known by its message (queue, id), so a body naming another chord counts for nothing. Chains
-- need no table: the steps still to run travel in the message body (its `then` key). Gone with
-- the member's queue; no grant to anyone: the functions are the only way in.
CREATE TABLE queue_pg.chords (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    callback_queue text NOT NULL,
    callback jsonb NOT NULL,
    size integer NOT NULL CHECK (size > 0),
    pending integer NOT NULL CHECK (pending >= 0),
    created_at timestamptz NOT NULL
);
CREATE TABLE queue_pg.chord_members (
    chord_id bigint NOT NULL REFERENCES queue_pg.chords (id) ON DELETE CASCADE,
    idx integer NOT NULL,
    queue_id integer NOT NULL REFERENCES queue_pg.queues (id) ON DELETE CASCADE,
    message_id bigint NOT NULL,
    result jsonb,
    done_at timestamptz,
    PRIMARY KEY (chord_id, idx),
    UNIQUE (queue_id, message_id)
);
REVOKE ALL ON queue_pg.chords, queue_pg.chord_members FROM PUBLIC;
