-- A GiST index loses live entries when a rescanned index scan runs across a
-- split of the index's root page (PostgreSQL 15.18; found by Better Compute's
-- capacity torture test, see migrations/capacity/0008_overlap_index_out_of_reach.sql).
--
-- Run it in an empty database:  psql -X -f docs/postgres-gist-killitems.sql
-- It ends by showing live rows that an index scan no longer finds, and an
-- exclusion constraint admitting a row that overlaps one of them.
--
-- What happens: gistgettuple() remembers the offsets of items whose heap rows
-- it found dead (kill_prior_tuple) and marks them LP_DEAD in gistkillitems()
-- when it leaves the page, if the page's LSN has not changed since it read it.
-- gistrescan() resets neither numKilled nor curBlkno, and gistgettuple() reads
-- the root page on a rescan's first call without setting curBlkno or clearing
-- the remembered offsets. While the root is the only page (a leaf), curBlkno is
-- never valid and nothing is applied: the offsets pile up across rescans. Once
-- the root has split, the first leaf the next rescan reads gets them: the
-- LSN check passes (curPageLSN is that leaf's own), and items at offsets that
-- belonged to the old root page, now other rows, are marked dead. Scans skip
-- LP_DEAD items, so the rows vanish from every later index scan, the exclusion
-- constraint's check included, until the page is pruned (and then for good).
\set ON_ERROR_STOP 1
CREATE EXTENSION IF NOT EXISTS btree_gist;
DROP TABLE IF EXISTS t;
CREATE TABLE t (id serial PRIMARY KEY, k int NOT NULL, r int4range NOT NULL, note text,
                EXCLUDE USING gist (k WITH =, r WITH &&));
-- One leaf page (the root): keys 1..10, four rows each; the rows of the even
-- keys deleted (dead to every snapshot once committed).
INSERT INTO t (k, r) SELECT k, int4range(j * 10, j * 10 + 5) FROM generate_series(0, 3) j, generate_series(1, 10) k;
DELETE FROM t WHERE k % 2 = 0;

-- Inserting 400 more rows splits the root.
CREATE OR REPLACE FUNCTION split_root() RETURNS int LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO t (k, r) SELECT 100 + g, int4range(0, 5) FROM generate_series(1, 400) g;
    RETURN 0;
END $$;

-- One statement: a nested loop whose inner side is the GiST index, rescanned
-- for each key; the scans of the even keys find only dead rows (and remember
-- them), and the outer row of key 6 splits the root.
BEGIN;
SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;
SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; SET LOCAL enable_material = off;
SELECT array_agg(o.k) AS keys_without_rows
  FROM (SELECT k, CASE WHEN k = 6 THEN split_root() ELSE 0 END AS x FROM generate_series(1, 10) k OFFSET 0) o
 WHERE NOT EXISTS (SELECT t.note FROM t WHERE t.k = o.k AND t.r && int4range(0, 1000));
COMMIT;

-- Live rows of keys 1..10 by a sequential scan, and by the index.
BEGIN;
SET LOCAL enable_indexscan = off; SET LOCAL enable_bitmapscan = off; SET LOCAL enable_indexonlyscan = off;
SELECT count(*) AS live_rows FROM t WHERE k BETWEEN 1 AND 10;
COMMIT;
BEGIN;
SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off;
SELECT count(*) AS found_by_the_index FROM t WHERE k BETWEEN 1 AND 10 AND r && int4range(0, 1000);
COMMIT;

-- Every live row of keys 1..10 should refuse an overlapping row; the lost ones
-- do not.
CREATE OR REPLACE FUNCTION admitted_overlaps() RETURNS SETOF int LANGUAGE plpgsql
    SET enable_indexscan = off SET enable_bitmapscan = off AS $$  -- read the rows from the heap
DECLARE row t;
BEGIN
    FOR row IN SELECT * FROM t WHERE k BETWEEN 1 AND 10 ORDER BY id LOOP
        BEGIN
            INSERT INTO t (k, r) VALUES (row.k, row.r);
            RETURN NEXT row.id;
            RAISE EXCEPTION USING ERRCODE = 'P0001';  -- undo the overlapping row
        EXCEPTION
            WHEN exclusion_violation THEN NULL;    -- refused, as it must be
            WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END $$;
SELECT array_agg(a) AS live_rows_whose_overlap_was_admitted FROM admitted_overlaps() a;
