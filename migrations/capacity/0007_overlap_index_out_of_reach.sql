-- capacity/0007_overlap_index_out_of_reach: the exclusion constraint's GiST
-- index is rebuilt on expressions no query names, so that only the constraint's
-- own checks ever scan it, and a btree index serves the reads by device.
--
-- Why: a PostgreSQL GiST index scan that is rescanned (the inner side of a
-- nested loop: "for each device, NOT EXISTS a live booking over this range",
-- as capacity_reserve_fast, the availability queries and any operator's query
-- can be planned) remembers the items it found pointing at dead rows and
-- marks them LP_DEAD later. A rescan keeps what the round before remembered,
-- and while the index is a single (root) page nothing is applied. When the
-- root splits in the middle of such a statement, the next round marks the
-- remembered offsets, which were positions on the old root, on a new leaf:
-- items of live bookings become dead, every later scan (the constraint's check
-- included) skips them, and an overlapping booking of the same device commits.
-- The same can follow a leaf split whose parent update leaves the leaf and the
-- root with one LSN. Found in PostgreSQL 15.18 (gistget.c, gistkillitems; the
-- rescan in gistscan.c resets neither numKilled nor curBlkno); reproduced in
-- one session by capacity's TestOverlapConstraintSurvivesRescansAcrossItsIndexSplit
-- and by docs/postgres-gist-killitems.sql on a plain table.
--
-- The constraint's own checks are safe: each is a fresh index scan, begun and
-- ended per check. So the index now holds (device_id || '') and
-- (during * '(,)'), which equal device_id and during, under the predicate
-- (state || '') IN ('hold', 'confirmed'), which equals the old one. The
-- planner uses an index for a query only when the query names its expressions,
-- or (for a full scan) implies its predicate; none does, nor can by accident,
-- so no plan scans it, rescanned or not, even with sequential scans disabled.
-- capacity_bookings_device_live takes over the lookups of a device's live
-- bookings.
--
-- Building the new constraint rebuilds the index from the table, so items an
-- affected index had lost come back. If the bug already let two overlapping
-- live bookings commit, ADD CONSTRAINT fails with 23P01 naming them, and this
-- migration rolls back: release one of the two (capacity.ReleaseTx), then
-- migrate again.
CREATE INDEX capacity_bookings_device_live ON capacity_bookings (device_id, lower(during))
    WHERE state IN ('hold', 'confirmed');

ALTER TABLE capacity_bookings
    DROP CONSTRAINT capacity_bookings_no_overlap,
    ADD CONSTRAINT capacity_bookings_no_overlap
        EXCLUDE USING gist ((device_id || '') WITH =, (during * '(,)'::tstzrange) WITH &&)
        WHERE ((state || '') IN ('hold', 'confirmed'));
